package io.databus.spark;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.readStream.format("databus")} on the JVM: the relay's wire format read by
 * Spark's own executors, with the rows, schema, offsets and options of the Python source
 * ({@code databus.spark.source}). Registered under {@code databus} (Spark prefers a JVM
 * source over a Python one of the same name) and {@code databus-jvm}.
 *
 * <p>{@code load()} checks the options and asks the relay for the sources and their
 * schemas: a bad option, an unknown source or an unreachable relay fails there with the
 * Python source's message. Streaming reads ({@link DatabusStream}) and batch reads (from
 * {@code startingPosition} to the relay's newest window when the read is planned).
 */
public class DatabusProvider implements TableProvider, DataSourceRegister {

    /** The same source under the name {@code databus-jvm} (fails when the jar is absent). */
    public static final class Jvm extends DatabusProvider {
        @Override
        public String shortName() {
            return "databus-jvm";
        }
    }

    private Plan plan;

    @Override
    public String shortName() {
        return "databus";
    }

    /** What load() learned from the relay: options, sources, schemas. */
    record Plan(SourceOptions opts, List<Integer> srcIds, String registryJson, StructType schema,
                StructType row, Offsets.Identity identity) {}

    private Plan plan(Map<String, String> options) {
        if (plan == null) {
            plan = makePlan(options);
        }
        return plan;
    }

    static Plan makePlan(Map<String, String> options) {
        return makePlan(options, false);
    }

    /** {@code changelog}: the plan of a read of Spark's changelog API (change rows). */
    static Plan makePlan(Map<String, String> options, boolean changelog) {
        SourceOptions opts = SourceOptions.parse(options);
        if (changelog) {
            opts = opts.asChangelog();
        }
        List<Integer> ids = new ArrayList<>();
        List<String> names = new ArrayList<>();
        String registry;
        String origin;
        try {
            RelayClient conn = new RelayClient(opts);
            // a relay restarting when a query (re)starts is waited for as a running read
            // waits for it: relayRetrySeconds, then the error
            RelayClient.Catalog catalog = Planning.retrying(conn::catalog, opts.relayRetrySeconds);
            List<Map.Entry<Integer, String>> known = catalog.sources();
            origin = catalog.origin();
            for (String w : opts.sources) {
                List<Map.Entry<Integer, String>> match = new ArrayList<>();
                for (Map.Entry<Integer, String> s : known) {
                    String name = s.getValue();
                    String table = name.contains(".") ? name.substring(name.indexOf('.') + 1) : name;
                    if (String.valueOf(s.getKey()).equals(w) || name.equals(w) || table.equals(w)) {
                        match.add(s);
                    }
                }
                if (match.size() != 1) {
                    if (match.isEmpty()) {
                        conn.refused(w);
                    }
                    StringBuilder served = new StringBuilder();
                    for (Map.Entry<Integer, String> s : known) {
                        served.append(served.length() > 0 ? ", " : "").append(s.getValue()).append(" (")
                            .append(s.getKey()).append(')');
                    }
                    throw new DatabusSourceException("UnknownSource", "databus source: source '" + w + "' "
                        + (match.isEmpty() ? "is not served" : "is ambiguous") + " by relay " + conn.url()
                        + "; it serves: " + (served.length() == 0 ? "none" : served));
                }
                ids.add(match.get(0).getKey());
                names.add(match.get(0).getValue());
            }
            registry = Planning.retrying(() -> conn.register(ids), opts.relayRetrySeconds);
        } catch (DatabusSourceException e) {
            String m = e.getMessage();
            throw new DatabusSourceException(e.code(), m.startsWith("databus source:") ? m : "databus source: " + m,
                e.isTransient(), e);
        }
        StructType row = null;
        if (!opts.jsonValues) {
            if (ids.size() != 1) {
                throw DatabusSourceException.config("databus source: typed before/after structs need exactly "
                    + "one source; give one source per stream or set valueFormat=json");
            }
            DataType t = Registry.parse(registry).latest(ids.get(0)).avro().sparkType();
            if (!(t instanceof StructType)) {
                throw DatabusSourceException.schema("databus source: the table schema is not a record");
            }
            row = (StructType) t;
        }
        StructType schema;
        if (opts.changelog) {
            schema = changelogSchema(row, Registry.parse(registry).latest(ids.get(0)).name());
        } else if (opts.flat) {
            List<String> clash = new ArrayList<>();
            for (String n : row.fieldNames()) {
                if (n.equals("_op") || n.equals("_sequence")) {
                    clash.add("'" + n + "'");
                }
            }
            if (!clash.isEmpty()) {
                throw DatabusSourceException.config("databus source: envelope=flat: "
                    + Registry.parse(registry).latest(ids.get(0)).name() + " has columns " + clash
                    + ": use envelope=full");
            }
            schema = readSchema(row, true);
        } else {
            schema = readSchema(row, false);
        }
        Offsets.Identity identity = new Offsets.Identity(Offsets.Identity.address(opts.relay), origin,
            List.copyOf(names));
        return new Plan(opts, List.copyOf(ids), registry, schema, row, identity);
    }

    /**
     * The rows of a read that is not a changelog one: the change envelope with {@code row}
     * as before/after (JSON text when {@code row} is null), or with {@code flat} the row's
     * columns, {@code _op} and {@code _sequence}.
     */
    static StructType readSchema(StructType row, boolean flat) {
        if (!flat) {
            return envelope(row == null ? DataTypes.StringType : row);
        }
        List<StructField> f = new ArrayList<>(List.of(row.fields()));
        f.add(field("_op", DataTypes.StringType));
        f.add(field("_sequence", sequenceType()));
        return new StructType(f.toArray(new StructField[0]));
    }

    /** The names Spark's changelog API gives the change columns after the row's own. */
    static final String[] CHANGE_COLUMNS = {"_change_type", "_commit_version", "_commit_timestamp"};

    /** A changelog read's rows: the table's columns, then {@link #CHANGE_COLUMNS}. */
    static StructType changelogSchema(StructType row, String table) {
        List<String> clash = new ArrayList<>();
        for (String n : row.fieldNames()) {
            if (List.of(CHANGE_COLUMNS).contains(n)) {
                clash.add("'" + n + "'");
            }
        }
        if (!clash.isEmpty()) {
            throw DatabusSourceException.config("databus changelog: " + table + " has columns " + clash
                + " that Spark's changelog API reserves: read it with format(\"databus\")");
        }
        List<StructField> f = new ArrayList<>(List.of(row.fields()));
        f.add(new StructField(CHANGE_COLUMNS[0], DataTypes.StringType, false, Metadata.empty()));
        f.add(new StructField(CHANGE_COLUMNS[1], DataTypes.LongType, false, Metadata.empty()));
        f.add(new StructField(CHANGE_COLUMNS[2], DataTypes.TimestampType, false, Metadata.empty()));
        return new StructType(f.toArray(new StructField[0]));
    }

    /** The change envelope with {@code image} as before/after (databus.spark.arrow). */
    static StructType envelope(DataType image) {
        return new StructType(new StructField[] {
            field("op", DataTypes.StringType), field("scn", DataTypes.LongType),
            field("sequence", sequenceType()), field("ts_ms", DataTypes.LongType),
            field("source", new StructType(new StructField[] {
                field("db", DataTypes.StringType), field("table", DataTypes.StringType),
                field("scn", DataTypes.LongType), field("file", DataTypes.StringType),
                field("pos", DataTypes.LongType), field("gtid", DataTypes.StringType),
                field("server_id", DataTypes.LongType), field("row", DataTypes.IntegerType),
                field("snapshot", DataTypes.BooleanType)})),
            field("key", DataTypes.StringType), field("before", image), field("after", image)});
    }

    static StructField field(String name, DataType t) {
        return new StructField(name, t, true, Metadata.empty());
    }

    static StructType sequenceType() {
        return new StructType(new StructField[] {field("scn", DataTypes.LongType), field("index", DataTypes.IntegerType)});
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return plan(options.asCaseSensitiveMap()).schema();
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new DatabusTable(plan(properties));
    }

    @Override
    public boolean supportsExternalMetadata() {
        return false;
    }

    /** The relay's change stream as a table Spark reads. */
    static final class DatabusTable implements SupportsRead {
        private final Plan plan;

        DatabusTable(Plan plan) {
            this.plan = plan;
        }

        @Override
        public String name() {
            return "databus(" + String.join(",", plan.opts().sources) + ")";
        }

        // columns() is the newer name; its default implementation reads this one
        @SuppressWarnings("deprecation")
        @Override
        public StructType schema() {
            return plan.schema();
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.MICRO_BATCH_READ, TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new DatabusScan(plan);
        }
    }

    /**
     * A read of the table: a stream, or one batch up to the relay's newest window.
     *
     * <p>Reports a size estimate ({@link SupportsReportStatistics}) so that Spark does not
     * size the input at {@code spark.sql.defaultSizeInBytes} (8 EiB: never broadcast, the
     * largest side of every join) when it plans what reads it, e.g. a MERGE fed by a
     * micro-batch: {@link Planning#estimate} over the batch's SCN range (a stream: the
     * range its last {@code latestOffset} planned, or the relay's whole buffer when it
     * planned none, as for a batch re-run after a restart; a batch read: from
     * {@code startingPosition} to the relay's newest window). The relay's wire bytes and
     * data events; unknown (Spark's default) when the relay cannot be asked.
     */
    static final class DatabusScan implements Scan, Batch, SupportsReportStatistics {
        private final Plan plan;
        private volatile DatabusStream stream;
        private long[] estimatedFor;  // the range of the cached estimate
        private Planning.Size estimated;

        DatabusScan(Plan plan) {
            this.plan = plan;
        }

        @Override
        public StructType readSchema() {
            return plan.schema();
        }

        @Override
        public String description() {
            return "databus relay " + plan.opts().relay + " sources " + plan.opts().sources;
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            DatabusStream s = new DatabusStream(plan.opts(), plan.srcIds(), plan.registryJson(), plan.row(),
                plan.identity());
            stream = s;
            return s;
        }

        @Override
        public synchronized Statistics estimateStatistics() {
            SourceOptions o = plan.opts();
            Planning.Size size;
            try {
                RelayClient conn = new RelayClient(o);
                long[] range;
                if (stream != null) {
                    long[] r = stream.plannedRange();
                    range = r != null ? r : new long[] {-1, Long.MAX_VALUE};
                } else {
                    range = new long[] {DatabusStream.initial(o, plan.srcIds(), plan.identity()).scn(), Long.MAX_VALUE};
                }
                if (estimated != null && java.util.Arrays.equals(range, estimatedFor)) {
                    size = estimated;
                } else {
                    size = Planning.estimate(conn, range[0], range[1]);
                    estimated = size;
                    estimatedFor = range;
                }
            } catch (DatabusSourceException e) {
                size = null;  // only an optimiser hint: never fail the query for it
            }
            Planning.Size known = size;
            return new Statistics() {
                @Override
                public OptionalLong sizeInBytes() {
                    return known == null ? OptionalLong.empty() : OptionalLong.of(known.bytes());
                }

                @Override
                public OptionalLong numRows() {
                    return known == null ? OptionalLong.empty() : OptionalLong.of(known.rows());
                }
            };
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            SourceOptions o = plan.opts();
            Offsets.DatabusOffset start = DatabusStream.initial(o, plan.srcIds(), plan.identity());
            long top = Planning.relayTop(new RelayClient(o), plan.srcIds(), o.relayRetrySeconds);
            if (top <= start.scn()) {
                return new InputPartition[0];
            }
            return DatabusStream.partitions(start, top, o.partitions);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new BucketReader.Factory(plan.opts(), plan.srcIds(), plan.registryJson(), plan.row());
        }
    }
}
