package io.databus.spark;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A bucket read as columnar batches ({@code columnarBatchRows} > 0): the rows of
 * {@link BucketReader}, in the same order, written into Spark's on-heap column vectors
 * ({@link ColumnarDecoder}) up to {@code columnarBatchRows} rows per batch. A batch may hold
 * the rows of several windows and a window's rows may end one batch and start the next:
 * batches only carry rows inside one partition of one micro-batch, whose range (and so
 * the offsets Spark checkpoints) is planned by {@link DatabusStream} exactly as for the row
 * reader, so a checkpoint written by either reader resumes with the other.
 *
 * <p>One set of vectors per reader, reset for each batch (Spark consumes a batch before it
 * asks for the next, as with its own Parquet reader); {@link #close} frees them and stops
 * the read's fetch thread ({@link EventWalk#close}).
 */
final class ColumnarReader implements PartitionReader<ColumnarBatch> {
    private final EventWalk walk;
    private final ColumnarDecoder decoder;
    private final OnHeapColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final int capacity;
    private boolean done;

    ColumnarReader(BucketReader.Factory f, BucketReader.Bucket b) {
        SourceOptions o = f.opts();
        capacity = o.columnarBatchRows;
        walk = new EventWalk(o, f.srcIds(), b);
        StructType schema = DatabusProvider.readSchema(f.row(), o.flat);
        vectors = OnHeapColumnVector.allocateColumns(capacity, schema);
        batch = new ColumnarBatch(vectors);
        decoder = new ColumnarDecoder(f.decoder(walk), o.flat, vectors);
    }

    @Override
    public boolean next() {
        if (done) {
            return false;
        }
        for (OnHeapColumnVector v : vectors) {
            v.reset();
        }
        int n = 0;
        while (n < capacity) {
            EventWalk.Kind k = walk.step();
            if (k == EventWalk.Kind.END) {
                done = true;
                break;
            }
            if (k == EventWalk.Kind.DATA) {
                decoder.decode(walk.data, walk.event, walk.index, n++);
            }
        }
        batch.setNumRows(n);
        return n > 0;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() {
        walk.close();
        batch.close();
    }
}
