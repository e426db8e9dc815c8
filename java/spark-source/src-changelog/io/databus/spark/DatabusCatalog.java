package io.databus.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.connector.catalog.Changelog;
import org.apache.spark.sql.connector.catalog.ChangelogContext;
import org.apache.spark.sql.connector.catalog.ChangelogRange;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A relay as a Spark catalog (Spark's changelog API, 4.2 and later; compiled only for those
 * lines, from src-changelog): its tables are the relay's sources ({@code <catalog>.<db>.<table>}), and
 * {@link #loadChangelog} serves a source's change stream as change rows, so
 * {@code spark.readStream.changes("databus.shop.customers")} and SQL
 * {@code SELECT ... FROM databus.shop.customers CHANGES FROM VERSION n} read databus with
 * no column mapping ({@link DatabusChangelog}).
 *
 * <p>Configured with {@code spark.sql.catalog.<name>=io.databus.spark.DatabusCatalog} and
 * the {@code databus} format's options under {@code spark.sql.catalog.<name>.<option>}
 * ({@code relay} is required; {@code tokenFile}, {@code caFile}, {@code partitions},
 * {@code fetchBytes}, ...); a read's own options override them. A plain table read
 * ({@code spark.readStream.table(...)}) is the {@code databus} format's full envelope. The
 * catalog is read-only: creating, altering, dropping or renaming a table is refused.
 */
public class DatabusCatalog implements TableCatalog {

    /** The options Spark's CDC reads take (ChangelogContext): not the source's own. */
    private static final Set<String> CDC_OPTIONS = Set.of("startingversion", "endingversion",
        "startingtimestamp", "endingtimestamp", "startingboundinclusive", "endingboundinclusive",
        "deduplicationmode", "computeupdates");

    private String name;
    private Map<String, String> defaults;

    @Override
    public void initialize(String name, CaseInsensitiveStringMap options) {
        this.name = name;
        defaults = new HashMap<>(options.asCaseSensitiveMap());
        if (!defaults.keySet().stream().anyMatch(k -> k.equalsIgnoreCase("relay"))) {
            throw DatabusSourceException.config("databus catalog " + name + ": spark.sql.catalog." + name
                + ".relay (the relay's URL) is required");
        }
    }

    @Override
    public String name() {
        return name;
    }

    /** The relay's source a table identifier names: {@code db.table}. */
    static String source(Identifier ident) {
        List<String> parts = new ArrayList<>(Arrays.asList(ident.namespace()));
        parts.add(ident.name());
        return String.join(".", parts);
    }

    /** The catalog's options, then a read's (CDC options dropped), for source {@code source}. */
    private Map<String, String> options(String source, Map<String, String> read) {
        Map<String, String> o = new HashMap<>(defaults);
        for (Map.Entry<String, String> e : read.entrySet()) {
            if (!CDC_OPTIONS.contains(e.getKey().toLowerCase(Locale.ROOT))) {
                o.keySet().removeIf(k -> k.equalsIgnoreCase(e.getKey()));
                o.put(e.getKey(), e.getValue());
            }
        }
        o.keySet().removeIf(k -> k.equalsIgnoreCase("sources"));
        o.put("sources", source);
        return o;
    }

    @Override
    public Identifier[] listTables(String[] namespace) {
        SourceOptions o = SourceOptions.parse(options("-", Map.of()));
        List<Identifier> out = new ArrayList<>();
        for (Map.Entry<Integer, String> s : Planning.retrying(new RelayClient(o)::catalog, 0).sources()) {
            String[] parts = s.getValue().split("\\.");
            String[] ns = Arrays.copyOf(parts, parts.length - 1);
            if (Arrays.equals(ns, namespace)) {
                out.add(Identifier.of(ns, parts[parts.length - 1]));
            }
        }
        return out.toArray(new Identifier[0]);
    }

    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        try {
            return new DatabusProvider.DatabusTable(DatabusProvider.makePlan(options(source(ident), Map.of())));
        } catch (DatabusSourceException e) {
            throw missing(ident, e);
        }
    }

    @Override
    public Changelog loadChangelog(Identifier ident, ChangelogContext context, CaseInsensitiveStringMap options)
            throws NoSuchTableException {
        Map<String, String> o = options(source(ident), options.asCaseSensitiveMap());
        String start = startingPosition(source(ident), context.range());
        if (start != null) {
            o.keySet().removeIf(k -> k.equalsIgnoreCase("startingPosition"));
            o.put("startingPosition", start);
        }
        try {
            return new DatabusChangelog(DatabusProvider.makePlan(o, true));
        } catch (DatabusSourceException e) {
            throw missing(ident, e);
        }
    }

    /**
     * The {@code startingPosition} of a changelog range: a version is an SCN, and the
     * source starts after window n (so an inclusive start n is n - 1); null for an
     * unbounded range (the read's or the catalog's {@code startingPosition}, default
     * earliest). An end version or a timestamp range is refused: the relay is a stream
     * with no end and no index by time.
     */
    static String startingPosition(String source, ChangelogRange range) {
        if (range instanceof ChangelogRange.UnboundedRange) {
            return null;
        }
        if (range instanceof ChangelogRange.VersionRange v) {
            if (v.endingVersion().isPresent()) {
                throw DatabusSourceException.config("databus changelog " + source + ": an ending version is not "
                    + "supported (a relay read ends at its newest window); give only a starting version");
            }
            long scn;
            try {
                scn = Long.parseLong(v.startingVersion().strip());
            } catch (NumberFormatException e) {
                throw DatabusSourceException.config("databus changelog " + source + ": a version is an SCN, got '"
                    + v.startingVersion() + "'");
            }
            return Long.toString(v.startingBoundInclusive() ? scn - 1 : scn);
        }
        throw DatabusSourceException.config("databus changelog " + source + ": a timestamp range is not supported "
            + "(the relay has no index by time); give a starting version (an SCN)");
    }

    private static RuntimeException missing(Identifier ident, DatabusSourceException e) throws NoSuchTableException {
        if ("UnknownSource".equals(e.code())) {
            NoSuchTableException n = new NoSuchTableException(ident);
            n.initCause(e);
            throw n;
        }
        return e;
    }

    @Override
    public Table alterTable(Identifier ident, TableChange... changes) {
        throw readOnly("alter", ident);
    }

    @Override
    public boolean dropTable(Identifier ident) {
        throw readOnly("drop", ident);
    }

    @Override
    public void renameTable(Identifier from, Identifier to) {
        throw readOnly("rename", from);
    }

    private UnsupportedOperationException readOnly(String what, Identifier ident) {
        return new UnsupportedOperationException("databus catalog " + name + " is read-only: cannot " + what + " "
            + source(ident) + " (its tables are the relay's sources)");
    }
}
