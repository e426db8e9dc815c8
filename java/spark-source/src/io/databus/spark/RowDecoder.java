package io.databus.spark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Supplier;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A data event to one row of the query's schema, as the Python source builds it
 * ({@code databus.spark.arrow}): the full envelope (op, scn, sequence, ts_ms, source, key,
 * before, after) or, with {@code envelope=flat}, the row's columns (the after image, else
 * the before image), {@code _op} and {@code _sequence}.
 *
 * <p>A changelog read (Spark's changelog API, {@link SourceOptions#changelog}) gives the
 * row's columns and {@code _change_type}, {@code _commit_version} (the SCN) and
 * {@code _commit_timestamp} (the window's time): an insert or snapshot read is one
 * {@code insert} row (the after image), a delete one {@code delete} row (the before image),
 * an update an {@code update_preimage} row (its before image, when the source sent one)
 * then an {@code update_postimage} row (the after image). A key changed more than once in
 * one window gives its net change for the window ({@link #endWindow}): {@link #decode}
 * returns null for each data event and the reader takes a window's rows at its end. A
 * truncate has no change-row form: it fails the read, naming the SCN.
 *
 * <p>The payload is the after image, except for deletes where it is the before image; the
 * metadata part may carry an update's before image (checked even when not kept, as the
 * Python source decodes it). A table version is matched to the query's row by column name:
 * a column the query lacks fails with "restart the query", a column the version lacks is
 * null. A schema id the registry lacks makes it fetch the relay's schemas once.
 */
final class RowDecoder {
    static final UTF8String[] OPS = new UTF8String[8];

    static {
        String[] letters = {"", "c", "u", "d", "r", "t", "", ""};
        for (int i = 0; i < 8; i++) {
            OPS[i] = UTF8String.fromString(letters[i]);
        }
    }

    /** How one table version's fields land in the query's row. */
    static final class Plan {
        final Registry.Version version;
        final int[] out;           // per Avro field: the row column (or -1 in json mode)
        final String error;        // non-null: a column the query lacks
        final UTF8String db;
        final UTF8String table;
        final String label;        // names the version in decode errors (built once, not per row)
        Object vectors;            // the columnar reader's writers for this version (ColumnarDecoder)

        Plan(Registry.Version v, int[] out, String error) {
            this.version = v;
            this.label = v.name() + " v" + v.version();
            this.out = out;
            this.error = error;
            this.db = UTF8String.fromString(v.db());
            this.table = UTF8String.fromString(v.table());
        }
    }

    private Registry registry;
    private final Supplier<Registry> refresh;
    private boolean refreshed;
    private final boolean flat;
    private final boolean changelog;
    final boolean json;
    private final int ncols;
    final Target[] targets;
    final String[] columns;
    private final Map<String, Plan> plans = new HashMap<>();
    private byte[] lastId = new byte[0];
    private Plan lastPlan;

    /** {@code row}: the query's row type; null for {@code valueFormat=json}. */
    RowDecoder(Registry registry, Supplier<Registry> refresh, StructType row, boolean flat) {
        this(registry, refresh, row, flat, false);
    }

    /** {@code changelog}: change rows (see the class comment); needs {@code row}. */
    RowDecoder(Registry registry, Supplier<Registry> refresh, StructType row, boolean flat, boolean changelog) {
        this.registry = registry;
        this.refresh = refresh;
        this.flat = flat;
        this.changelog = changelog;
        json = row == null;
        ncols = json ? 0 : row.fields().length;
        targets = new Target[ncols];
        columns = json ? new String[0] : row.fieldNames();
        for (int i = 0; i < ncols; i++) {
            targets[i] = new Target(row.fields()[i].dataType());
        }
    }

    Plan plan(byte[] buf, Wire e) {
        // consecutive events mostly share a table version: compare the digest bytes before
        // building the map key (a hex string per event was a tenth of the decode time)
        if (lastPlan != null && java.util.Arrays.equals(buf, e.digestOff, e.digestOff + e.digestLen,
                lastId, 0, lastId.length)) {
            return lastPlan;
        }
        String id = java.util.HexFormat.of().formatHex(buf, e.digestOff, e.digestOff + e.digestLen);
        Plan p = plans.get(id);
        if (p != null) {
            remember(buf, e, p);
            return p;
        }
        Registry.Version v = registry.find(buf, e.digestOff, e.digestLen);
        if (v == null && !refreshed) {
            // a table version added after load(): fetch the relay's schemas once
            registry = refresh.get();
            refreshed = true;
            v = registry.find(buf, e.digestOff, e.digestLen);
        }
        if (v == null) {
            throw DatabusSourceException.schema("unknown schema id " + id);
        }
        AvroType rec = v.avro();
        int[] out = new int[rec.children.length];
        List<String> extra = new ArrayList<>();
        for (int f = 0; f < out.length; f++) {
            out[f] = -1;
            for (int c = 0; c < ncols; c++) {
                if (columns[c].equals(rec.names[f])) {
                    out[f] = c;
                }
            }
            if (out[f] < 0 && !json) {
                extra.add("'" + rec.names[f] + "'");
            }
        }
        extra.sort(null);
        String error = extra.isEmpty() ? null : v.name() + " v" + v.version() + " has columns " + extra
            + " that the query's schema lacks: restart the query to pick up the new table version";
        p = new Plan(v, out, error);
        plans.put(id, p);
        remember(buf, e, p);
        return p;
    }

    private void remember(byte[] buf, Wire e, Plan p) {
        lastId = java.util.Arrays.copyOfRange(buf, e.digestOff, e.digestOff + e.digestLen);
        lastPlan = p;
    }

    /** Decodes an Avro row into {@code vals[0, ncols)} (or only checks it when {@code vals} is null). */
    void row(Plan p, byte[] buf, int off, int len, Object[] vals) {
        AvroType rec = p.version.avro();
        AvroReader in = new AvroReader(buf, off, off + len, p.label);
        for (int f = 0; f < rec.children.length; f++) {
            AvroType t = rec.children[f];
            Object v = t.read(in);
            if (vals != null) {
                int c = p.out[f];
                vals[c] = targets[c].convert(v, natural(t, v), columns[c]);
            }
        }
        // trailing bytes are ignored, as fastavro does
    }

    static AvroType natural(AvroType t, Object v) {
        if (t.kind != AvroType.Kind.UNION) {
            return t;
        }
        for (AvroType b : t.children) {
            if (b.kind == AvroType.Kind.RECORD || b.kind == AvroType.Kind.ARRAY || b.kind == AvroType.Kind.MAP) {
                return b;
            }
        }
        return null;
    }

    /** An Avro row as JSON text ({@code valueFormat=json}). */
    UTF8String jsonRow(Plan p, byte[] buf, int off, int len) {
        AvroType rec = p.version.avro();
        AvroReader in = new AvroReader(buf, off, off + len, p.label);
        Object[] vals = new Object[rec.children.length];
        for (int f = 0; f < vals.length; f++) {
            vals[f] = rec.children[f].read(in);
        }
        return UTF8String.fromString(JsonText.row(rec, vals));
    }

    /**
     * The row of the data event {@code e} (parsed from {@code buf}), window index
     * {@code index}; null in a changelog read (the event is folded into {@link #endWindow}).
     */
    InternalRow decode(byte[] buf, Wire e, int index) {
        Plan p = plan(buf, e);
        if (p.error != null) {
            throw DatabusSourceException.schema(p.error);
        }
        int op = e.attributes & 7;
        boolean delete = op == 3;
        Meta m = meta;
        m.read(buf, e);
        int beforeOff = m.beforeOff;
        int beforeLen = m.beforeLen;
        if (changelog) {
            change(p, buf, e, op, beforeOff, beforeLen);
            return null;
        }
        GenericInternalRow sequence = new GenericInternalRow(new Object[] {e.scn, index});
        if (flat) {
            Object[] vals = new Object[ncols + 2];
            if (e.payloadLen > 0) {
                row(p, buf, e.payloadOff, e.payloadLen, vals);
            }
            if (!delete && beforeOff >= 0) {  // kept only when there is no after image
                row(p, buf, beforeOff, beforeLen, e.payloadLen == 0 ? vals : null);
            }
            vals[ncols] = OPS[op];
            vals[ncols + 1] = sequence;
            return new GenericInternalRow(vals);
        }
        Object before = null;
        Object after = null;
        if (json) {
            if (e.payloadLen > 0) {
                UTF8String img = jsonRow(p, buf, e.payloadOff, e.payloadLen);
                if (delete) {
                    before = img;
                } else {
                    after = img;
                }
            }
            if (!delete && beforeOff >= 0) {
                before = jsonRow(p, buf, beforeOff, beforeLen);
            }
        } else if (e.payloadLen > 0) {
            Object[] vals = new Object[ncols];
            row(p, buf, e.payloadOff, e.payloadLen, vals);
            if (delete) {
                before = new GenericInternalRow(vals);
            } else {
                after = new GenericInternalRow(vals);
            }
        }
        if (!json && !delete && beforeOff >= 0) {
            Object[] vals = new Object[ncols];
            row(p, buf, beforeOff, beforeLen, vals);
            before = new GenericInternalRow(vals);
        }
        GenericInternalRow source = new GenericInternalRow(new Object[] {p.db, p.table, e.scn, m.file, m.pos,
            m.gtid, m.serverId, m.rowNo, (e.attributes & Wire.ATTR_SNAPSHOT) != 0});
        return new GenericInternalRow(new Object[] {OPS[op], e.scn, sequence,
            Math.floorDiv(e.timestampNs, 1_000_000L), source, key(buf, e), before, after});
    }

    private final Meta meta = new Meta();

    /** The metadata part of a data event: before, txid, file, pos, gtid, server_id, row (each ["null", x]). */
    static final class Meta {
        int beforeOff;        // -1: no before image
        int beforeLen;
        UTF8String file;
        Long pos;
        UTF8String gtid;
        Long serverId;
        Integer rowNo;

        /** Reads {@code e}'s metadata part (all null when it has none); a damaged part is a SchemaError. */
        void read(byte[] buf, Wire e) {
            beforeOff = -1;
            beforeLen = 0;
            file = null;
            pos = null;
            gtid = null;
            serverId = null;
            rowNo = null;
            if (e.metaOff < 0) {
                return;
            }
            AvroReader m = new AvroReader(buf, e.metaOff, e.metaOff + e.metaLen, "the metadata part");
            for (int f = 0; f < 7; f++) {
                long b = m.zlong();
                if (b != 0 && b != 1) {
                    throw m.bad("union branch " + b);
                }
                if (b == 0) {
                    continue;
                }
                switch (f) {
                    case 0: {
                        byte[] before = m.bytes();
                        beforeLen = before.length;
                        beforeOff = m.pos - beforeLen;
                        break;
                    }
                    case 1: m.utf8(); break;
                    case 2: file = m.utf8(); break;
                    case 3: pos = m.zlong(); break;
                    case 4: gtid = m.utf8(); break;
                    case 5: serverId = m.zlong(); break;
                    default: {
                        long r = m.zlong();
                        if (r < Integer.MIN_VALUE || r > Integer.MAX_VALUE) {
                            throw m.bad("row " + r);
                        }
                        rowNo = (int) r;
                    }
                }
            }
        }
    }

    static final UTF8String INSERT = UTF8String.fromString("insert");
    static final UTF8String DELETE = UTF8String.fromString("delete");
    static final UTF8String PREIMAGE = UTF8String.fromString("update_preimage");
    static final UTF8String POSTIMAGE = UTF8String.fromString("update_postimage");

    /** One key's changes in the open window: its image before the window, and after. */
    private static final class Net {
        boolean existed;      // the key had a row before the window
        Object[] before;      // that row (null: unknown, an update without a before image)
        Object[] after;       // its row after the window's changes so far; null: none
        long scn;
    }

    private final java.util.LinkedHashMap<UTF8String, Net> window = new java.util.LinkedHashMap<>();

    /** Folds a data event into its key's net change in the open window. */
    private void change(Plan p, byte[] buf, Wire e, int op, int beforeOff, int beforeLen) {
        if (op == 5) {
            throw DatabusSourceException.schema("databus changelog: " + p.label + " was truncated at SCN " + e.scn
                + ": a truncate has no change-row form; read it with format(\"databus\")");
        }
        Object[] image = new Object[ncols + 3];
        if (e.payloadLen > 0) {
            row(p, buf, e.payloadOff, e.payloadLen, image);
        }
        Object[] before = null;
        if (op == 2 && beforeOff >= 0) {
            before = new Object[ncols + 3];
            row(p, buf, beforeOff, beforeLen, before);
        }
        UTF8String k = key(buf, e);
        Net n = window.get(k);
        if (n == null) {
            n = new Net();
            n.existed = op == 2 || op == 3;
            n.before = op == 3 ? image : before;
            window.put(k, n);
        }
        if (n.existed && n.before == null && op == 3) {
            n.before = image;  // the update that opened the key had no before image
        }
        n.after = op == 3 ? null : image;
        n.scn = e.scn;
    }

    /**
     * The open window's change rows, one change per key (the window's net change, Spark's
     * "at most one change per row per commit version"), keys in their first change's order;
     * the window is closed. A key inserted and deleted in the window gives nothing, one
     * deleted then inserted gives an update. {@code commitNs}: the window's time (its
     * end-of-window event's), every row's {@code _commit_timestamp}, so the rows of one
     * commit version share one commit time in every partition.
     */
    List<InternalRow> endWindow(long commitNs) {
        List<InternalRow> out = new ArrayList<>();
        long micros = Math.floorDiv(commitNs, 1_000L);
        for (Map.Entry<UTF8String, Net> en : window.entrySet()) {
            Net n = en.getValue();
            if (!n.existed) {
                if (n.after != null) {
                    out.add(changeRow(n.after, INSERT, n.scn, micros));
                }
            } else if (n.after == null) {
                out.add(changeRow(n.before, DELETE, n.scn, micros));
            } else {
                if (n.before != null) {
                    out.add(changeRow(n.before, PREIMAGE, n.scn, micros));
                }
                out.add(changeRow(n.after, POSTIMAGE, n.scn, micros));
            }
        }
        window.clear();
        return out;
    }

    private InternalRow changeRow(Object[] image, UTF8String kind, long scn, long micros) {
        Object[] vals = image.clone();
        vals[ncols] = kind;
        vals[ncols + 1] = scn;
        vals[ncols + 2] = micros;
        return new GenericInternalRow(vals);
    }

    /** The event key as text: decimal, UTF-8, or 0x + hex. */
    static UTF8String key(byte[] buf, Wire e) {
        if (!e.keyBytes) {
            return UTF8String.fromString(Long.toString(e.intKey));
        }
        if (Utf8.valid(buf, e.keyOff, e.keyLen)) {
            return UTF8String.fromBytes(buf, e.keyOff, e.keyLen);
        }
        return UTF8String.fromString("0x" + java.util.HexFormat.of().formatHex(buf, e.keyOff, e.keyOff + e.keyLen));
    }
}
