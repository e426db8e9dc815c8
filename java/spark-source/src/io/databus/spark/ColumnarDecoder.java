package io.databus.spark;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A data event into one slot of the read's column vectors: the row {@link RowDecoder#decode}
 * builds (full envelope, {@code envelope=flat} or {@code valueFormat=json}), written column
 * by column without an {@code InternalRow}. Table versions, schema refreshes, the metadata
 * part and every conversion are the row decoder's ({@link RowDecoder.Plan},
 * {@link RowDecoder.Meta}, {@link VectorPut}): the same values, nulls and errors. Each
 * slot of a batch is written once (values or nulls), the vectors being reset per batch.
 */
final class ColumnarDecoder {
    /** One table version's writers: one per Avro field, and the query's columns it lacks. */
    private record Writers(VectorPut[] puts, int[] missing) {}

    private final RowDecoder rows;
    private final boolean flat;
    private final boolean json;
    private final RowDecoder.Meta meta = new RowDecoder.Meta();
    private final byte[] digits = new byte[20];
    // the envelope's vectors (the full one; flat: image columns, op and sequence only)
    private final WritableColumnVector op;
    private final WritableColumnVector scn;
    private final WritableColumnVector seqScn;
    private final WritableColumnVector seqIndex;
    private final WritableColumnVector ts;
    private final WritableColumnVector source;
    private final WritableColumnVector key;
    private final WritableColumnVector before;
    private final WritableColumnVector after;
    private final WritableColumnVector[] beforeCols;   // struct values: the before struct's fields
    private final WritableColumnVector[] afterCols;    // ... the after struct's; flat: the row's columns

    /** {@code out}: the vectors of the read schema ({@code DatabusProvider.envelope} or the flat one). */
    ColumnarDecoder(RowDecoder rows, boolean flat, WritableColumnVector[] out) {
        this.rows = rows;
        this.flat = flat;
        int n = rows.columns.length;
        json = rows.json;
        if (flat) {
            afterCols = java.util.Arrays.copyOf(out, n);
            beforeCols = null;
            op = out[n];
            seqScn = out[n + 1].getChild(0);
            seqIndex = out[n + 1].getChild(1);
            scn = ts = source = key = before = after = null;
            return;
        }
        op = out[0];
        scn = out[1];
        seqScn = out[2].getChild(0);
        seqIndex = out[2].getChild(1);
        ts = out[3];
        source = out[4];
        key = out[5];
        before = out[6];
        after = out[7];
        beforeCols = json ? null : children(before, n);
        afterCols = json ? null : children(after, n);
    }

    private static WritableColumnVector[] children(WritableColumnVector v, int n) {
        WritableColumnVector[] c = new WritableColumnVector[n];
        for (int i = 0; i < n; i++) {
            c[i] = v.getChild(i);
        }
        return c;
    }

    private Writers writers(RowDecoder.Plan p) {
        if (p.vectors instanceof Writers w) {
            return w;
        }
        AvroType rec = p.version.avro();
        VectorPut[] puts = new VectorPut[rec.children.length];
        boolean[] mapped = new boolean[rows.columns.length];
        for (int f = 0; f < puts.length; f++) {
            int c = p.out[f];
            mapped[c] = true;
            puts[f] = VectorPut.of(rec.children[f], rows.targets[c], rows.columns[c]);
        }
        List<Integer> missing = new ArrayList<>();
        for (int c = 0; c < mapped.length; c++) {
            if (!mapped[c]) {
                missing.add(c);
            }
        }
        Writers w = new Writers(puts, missing.stream().mapToInt(Integer::intValue).toArray());
        p.vectors = w;
        return w;
    }

    /** An Avro row image into {@code cols[.., slot]}: every column written, a value or null. */
    private void image(RowDecoder.Plan p, byte[] buf, int off, int len, WritableColumnVector[] cols, int slot) {
        Writers w = writers(p);
        for (int c : w.missing()) {
            cols[c].putNull(slot);
        }
        AvroReader in = new AvroReader(buf, off, off + len, p.label);
        VectorPut[] puts = w.puts();
        for (int f = 0; f < puts.length; f++) {
            puts[f].put(in, cols[p.out[f]], slot);
        }
        // trailing bytes are ignored, as fastavro does
    }

    private static void nulls(WritableColumnVector[] cols, int slot) {
        for (WritableColumnVector c : cols) {
            c.putNull(slot);
        }
    }

    /** The data event {@code e} (parsed from {@code buf}), window index {@code index}, into {@code slot}. */
    void decode(byte[] buf, Wire e, int index, int slot) {
        RowDecoder.Plan p = rows.plan(buf, e);
        if (p.error != null) {
            throw DatabusSourceException.schema(p.error);
        }
        int code = e.attributes & 7;
        boolean delete = code == 3;
        RowDecoder.Meta m = meta;
        m.read(buf, e);
        if (flat) {
            boolean written = false;
            if (e.payloadLen > 0) {
                image(p, buf, e.payloadOff, e.payloadLen, afterCols, slot);
                written = true;
            }
            if (!delete && m.beforeOff >= 0) {  // kept only when there is no after image
                if (e.payloadLen == 0) {
                    image(p, buf, m.beforeOff, m.beforeLen, afterCols, slot);
                    written = true;
                } else {
                    rows.row(p, buf, m.beforeOff, m.beforeLen, null);
                }
            }
            if (!written) {
                nulls(afterCols, slot);
            }
            VectorPut.utf8(op, slot, RowDecoder.OPS[code]);
            seqScn.putLong(slot, e.scn);
            seqIndex.putInt(slot, index);
            return;
        }
        if (json) {
            UTF8String img = null;
            UTF8String prior = null;
            if (e.payloadLen > 0) {
                img = rows.jsonRow(p, buf, e.payloadOff, e.payloadLen);
            }
            if (!delete && m.beforeOff >= 0) {
                prior = rows.jsonRow(p, buf, m.beforeOff, m.beforeLen);
            }
            VectorPut.utf8(after, slot, delete ? null : img);
            VectorPut.utf8(before, slot, delete ? img : prior);
        } else {
            boolean haveBefore = false;
            boolean haveAfter = false;
            if (e.payloadLen > 0) {
                image(p, buf, e.payloadOff, e.payloadLen, delete ? beforeCols : afterCols, slot);
                haveBefore = delete;
                haveAfter = !delete;
            }
            if (!delete && m.beforeOff >= 0) {
                image(p, buf, m.beforeOff, m.beforeLen, beforeCols, slot);
                haveBefore = true;
            }
            if (!haveBefore) {
                before.putNull(slot);
            }
            if (!haveAfter) {
                after.putNull(slot);
            }
        }
        VectorPut.utf8(op, slot, RowDecoder.OPS[code]);
        scn.putLong(slot, e.scn);
        seqScn.putLong(slot, e.scn);
        seqIndex.putInt(slot, index);
        ts.putLong(slot, Math.floorDiv(e.timestampNs, 1_000_000L));
        VectorPut.utf8(source.getChild(0), slot, p.db);
        VectorPut.utf8(source.getChild(1), slot, p.table);
        source.getChild(2).putLong(slot, e.scn);
        VectorPut.utf8(source.getChild(3), slot, m.file);
        putLong(source.getChild(4), slot, m.pos);
        VectorPut.utf8(source.getChild(5), slot, m.gtid);
        putLong(source.getChild(6), slot, m.serverId);
        if (m.rowNo == null) {
            source.getChild(7).putNull(slot);
        } else {
            source.getChild(7).putInt(slot, m.rowNo);
        }
        source.getChild(8).putBoolean(slot, (e.attributes & Wire.ATTR_SNAPSHOT) != 0);
        key(buf, e, slot);
    }

    private static void putLong(WritableColumnVector v, int slot, Long x) {
        if (x == null) {
            v.putNull(slot);
        } else {
            v.putLong(slot, x);
        }
    }

    /** The event key as {@link RowDecoder#key} gives it, a number written without a String. */
    private void key(byte[] buf, Wire e, int slot) {
        if (e.keyBytes) {
            if (Utf8.valid(buf, e.keyOff, e.keyLen)) {
                key.putByteArray(slot, buf, e.keyOff, e.keyLen);
            } else {
                VectorPut.utf8(key, slot, RowDecoder.key(buf, e));
            }
            return;
        }
        long k = e.intKey;
        if (k == Long.MIN_VALUE) {
            VectorPut.utf8(key, slot, RowDecoder.key(buf, e));
            return;
        }
        int p = digits.length;
        long a = Math.abs(k);
        do {
            digits[--p] = (byte) ('0' + a % 10);
            a /= 10;
        } while (a != 0);
        if (k < 0) {
            digits[--p] = '-';
        }
        key.putByteArray(slot, digits, p, digits.length - p);
    }
}
