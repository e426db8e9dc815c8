package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
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
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("databus-snapshot")} on the JVM: a bootstrap server's snapshot as
 * a DataFrame, read over HTTP by Spark's own executors with the rows, schema and options of
 * the Python reader ({@code databus.spark.snapshot}). Registered under
 * {@code databus-snapshot} (Spark prefers a JVM source over a Python one of the same name)
 * and {@code databus-snapshot-jvm}.
 *
 * <p>Where it reads: {@code store} is the bootstrap server's {@code http(s)://} URL. Given a
 * store's SQLAlchemy URL instead ({@code sqlite:///...}), {@code databus-snapshot} hands the
 * whole read to the Python reader registered as {@code databus-snapshot-python} (by
 * {@code databus.spark.register_snapshot}): the JVM does not open the store's database.
 *
 * <p>Plan, made at {@code load()}: {@code /sources} (names to ids), {@code /register} (the
 * schemas), {@code /startSCN?idSpan=true} (the applied SCN and the row id span), the
 * snapshot SCN {@code X} (option {@code scn}, else the applied SCN) checked against the
 * server with a request that reads no row. The span is cut into {@code partitions} equal id
 * ranges ({@code databus.spark.snapshot.id_ranges}); partition {@code i} reads its range of
 * each source in turn with {@code /bootstrap?snapshotEnd=} ({@link SnapshotReader}). Why
 * "snapshot at X, then the stream after X" is exact: see the Python module.
 */
public class SnapshotProvider implements TableProvider, DataSourceRegister {
    private static final ObjectMapper JSON = new ObjectMapper();
    static final String PYTHON_FORMAT = "databus-snapshot-python";

    /** The JVM reader under {@code databus-snapshot-jvm}: a bootstrap server's URL only. */
    public static final class Jvm extends SnapshotProvider {
        @Override
        public String shortName() {
            return "databus-snapshot-jvm";
        }

        @Override
        boolean delegates(Map<String, String> options) {
            return false;
        }
    }

    private Plan plan;
    private TableProvider python;

    @Override
    public String shortName() {
        return SnapshotOptions.WHO;
    }

    /** Whether the Python reader serves these options (a store URL, not a server's). */
    boolean delegates(Map<String, String> options) {
        return !SnapshotOptions.isServer(options);
    }

    private TableProvider python() {
        if (python == null) {
            PythonDataSourceV2 p = new PythonDataSourceV2();
            p.setShortName(PYTHON_FORMAT);
            python = p;
        }
        return python;
    }

    /** What load() learned from the bootstrap server. */
    record Plan(SnapshotOptions opts, List<Integer> srcIds, List<String> names, String registryJson,
                StructType schema, StructType row, long scn, long lo, long hi) {}

    private Plan plan(Map<String, String> options) {
        if (plan == null) {
            plan = makePlan(options);
        }
        return plan;
    }

    static Plan makePlan(Map<String, String> options) {
        SnapshotOptions opts = SnapshotOptions.parse(options);
        String who = SnapshotOptions.WHO;
        List<Integer> ids = new ArrayList<>();
        List<String> names = new ArrayList<>();
        String registry;
        long scn;
        long lo;
        long hi;
        try {
            RelayClient conn = opts.client();
            List<Map.Entry<Integer, String>> known = Planning.retrying(conn::sources, 0);
            known.sort(Map.Entry.comparingByKey());
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
                    StringBuilder held = new StringBuilder();
                    for (Map.Entry<Integer, String> s : known) {
                        held.append(held.length() > 0 ? ", " : "").append(s.getValue()).append(" (")
                            .append(s.getKey()).append(')');
                    }
                    throw new DatabusSourceException("UnknownSource", who + ": source '" + w + "' "
                        + (match.isEmpty() ? "is not in" : "is ambiguous in") + " the bootstrap store of "
                        + conn.url() + "; it holds: " + (held.length() == 0 ? "none" : held));
                }
                if (!ids.contains(match.get(0).getKey())) {
                    ids.add(match.get(0).getKey());
                    names.add(match.get(0).getValue());
                }
            }
            registry = conn.register(ids);
            Map<String, String> p = new LinkedHashMap<>();
            p.put("sources", SnapshotReader.join(ids));
            p.put("idSpan", "true");
            JsonNode start = JSON.readTree(conn.get("/startSCN", p, null).body());
            long applied = start.path("startScn").asLong() - 1;
            JsonNode span = start.path("snapshotIdSpan");
            if (!span.isArray() || span.size() != 2) {
                throw new DatabusSourceException("TerminalError", "the bootstrap server " + conn.url()
                    + " does not answer /startSCN?idSpan=true (an older server): read the store with "
                    + "format(\"" + PYTHON_FORMAT + "\") and its SQLAlchemy URL");
            }
            lo = span.get(0).asLong();
            hi = span.get(1).asLong();
            scn = opts.scn == null ? applied : opts.scn;
            if (scn > applied) {
                throw new DatabusSourceException("BootstrapTooOld", "the snapshot is complete only to SCN "
                    + applied + ", scn=" + scn + " was asked (retry later)", true, null);
            }
            // a request that reads no row: the server's own checks of X (its log must reach it)
            SnapshotReader.page(conn, ids.get(0), SnapshotReader.checkpoint(scn, names.get(0), hi), 1, hi);
        } catch (IOException e) {
            throw new DatabusSourceException("TerminalError", who + ": /startSCN did not answer JSON: " + e);
        } catch (DatabusSourceException e) {
            String m = e.getMessage();
            throw new DatabusSourceException(e.code(), m.startsWith(who) ? m : who + ": " + m, e.isTransient(), e);
        }
        StructType row = null;
        if (!opts.jsonValues) {
            if (ids.size() != 1) {
                throw DatabusSourceException.config(who + ": typed after structs need exactly one source; read "
                    + "one source per DataFrame or set valueFormat=json");
            }
            DataType t = Registry.parse(registry).latest(ids.get(0)).avro().sparkType();
            if (!(t instanceof StructType)) {
                throw DatabusSourceException.schema(who + ": the table schema is not a record");
            }
            row = (StructType) t;
        }
        StructType schema = DatabusProvider.envelope(row == null ? org.apache.spark.sql.types.DataTypes.StringType : row);
        return new Plan(opts, List.copyOf(ids), List.copyOf(names), registry, schema, row, scn, lo, hi);
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        if (delegates(options)) {
            try {
                return python().inferSchema(options);
            } catch (Exception e) {  // Spark's AnalysisException is a checked type Scala throws
                if (String.valueOf(e.getMessage()).contains("DATA_SOURCE_NOT_EXIST")) {
                    throw DatabusSourceException.config(SnapshotOptions.WHO + ": a store's SQLAlchemy URL is read"
                        + " by the Python reader, which is not registered in this session: call "
                        + "databus.spark.register_snapshot(spark) first, or give the bootstrap server's "
                        + "http(s):// URL as store");
                }
                throw e;
            }
        }
        return plan(options.asCaseSensitiveMap()).schema();
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        if (delegates(properties)) {
            return python().getTable(schema, partitioning, properties);
        }
        return new SnapshotTable(plan(properties));
    }

    @Override
    public boolean supportsExternalMetadata() {
        return false;
    }

    /** {@code n} contiguous {@code (after, last]} id ranges covering {@code lo..hi} (as Python's id_ranges). */
    static long[][] idRanges(long lo, long hi, int n) {
        long width = Math.max(hi - lo + 1, 0);
        long[] cuts = new long[n + 1];
        for (int i = 0; i <= n; i++) {
            cuts[i] = lo - 1 + Math.floorDiv(Math.multiplyExact(width, (long) i), (long) n);
        }
        long[][] out = new long[n][];
        for (int i = 0; i < n; i++) {
            out[i] = new long[] {cuts[i], cuts[i + 1]};
        }
        return out;
    }

    /** The snapshot as a table Spark reads in one batch. */
    static final class SnapshotTable implements SupportsRead {
        private final Plan plan;

        SnapshotTable(Plan plan) {
            this.plan = plan;
        }

        @Override
        public String name() {
            return "databus-snapshot(" + String.join(",", plan.opts().sources) + ")";
        }

        // columns() is the newer name; its default implementation reads this one
        @SuppressWarnings("deprecation")
        @Override
        public StructType schema() {
            return plan.schema();
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new SnapshotScan(plan);
        }
    }

    /** One read of the snapshot at the plan's SCN: one input partition per id range. */
    static final class SnapshotScan implements Scan, Batch {
        private final Plan plan;

        SnapshotScan(Plan plan) {
            this.plan = plan;
        }

        @Override
        public StructType readSchema() {
            return plan.schema();
        }

        @Override
        public String description() {
            return "databus-snapshot " + plan.opts().store + " sources " + plan.opts().sources + " at SCN "
                + plan.scn();
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            long[][] r = idRanges(plan.lo(), plan.hi(), plan.opts().partitions);
            InputPartition[] out = new InputPartition[r.length];
            for (int i = 0; i < r.length; i++) {
                out[i] = new SnapshotReader.Range(i, r[i][0], r[i][1]);
            }
            return out;
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new SnapshotReader.Factory(plan.opts(), plan.srcIds(), plan.names(), plan.registryJson(),
                plan.row(), plan.scn());
        }
    }

    static String text(byte[] b, int off, int len) {
        return new String(b, off, len, StandardCharsets.UTF_8);
    }
}
