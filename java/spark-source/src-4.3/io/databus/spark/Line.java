package io.databus.spark;

/**
 * What differs between the Spark lines this reader is compiled for: this copy is Spark
 * 4.3's (java/spark-source/src-4.3, compiled only for that line by
 * scripts/java/build-spark-source.sh).
 */
final class Line {
    private Line() {}

    /** The Spark line this jar was compiled against. */
    static final String NAME = "4.3";

    /**
     * Avro {@code local-timestamp-*} as {@code TIMESTAMP_NTZ} (true) or {@code TIMESTAMP}:
     * what PySpark 4.3 makes of a zone-less Arrow timestamp, which is the Python source's
     * type, so both readers give one schema on a line.
     */
    static final boolean LOCAL_TIMESTAMP_NTZ = true;
}
