package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.catalog.Changelog;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * One relay source as Spark's {@code Changelog} (Spark 4.2 and later): the table's columns,
 * then {@code _change_type} ({@code insert}, {@code delete}, {@code update_preimage},
 * {@code update_postimage}), {@code _commit_version} (the SCN, a long) and
 * {@code _commit_timestamp} (the source's commit time). Read by the {@code databus}
 * format's scan (streaming and batch), MOD buckets and offsets as there.
 *
 * <p>What Spark's post-processing is told: no carry-over rows (the relay sends only real
 * changes), updates as pre/post image pairs (not delete + insert), and intermediate changes
 * (a key may change more than once in a range, even in one window): the row identity is the
 * table's key columns as the relay's {@code /register} lists them, the row version
 * {@code _commit_version}. A table without key columns has no row identity to give, and is
 * refused.
 */
final class DatabusChangelog implements Changelog {
    private final DatabusProvider.Plan plan;
    private final List<String> keys;

    DatabusChangelog(DatabusProvider.Plan plan) {
        this.plan = plan;
        keys = keys(plan.registryJson(), plan.srcIds().get(0));
        if (keys.isEmpty()) {
            throw DatabusSourceException.config("databus changelog: " + plan.identity().sources().get(0)
                + " has no key columns, which Spark's changelog API needs as the row identity");
        }
    }

    /** The key columns of the newest version of source {@code srcId} in a {@code /register} list. */
    static List<String> keys(String registryJson, int srcId) {
        List<String> out = new ArrayList<>();
        int version = Integer.MIN_VALUE;
        try {
            for (JsonNode s : new ObjectMapper().readTree(registryJson)) {
                if (s.path("id").asInt() == srcId && s.path("version").asInt() > version) {
                    version = s.path("version").asInt();
                    out.clear();
                    s.path("keys").forEach(k -> out.add(k.asText()));
                }
            }
        } catch (IOException e) {
            throw DatabusSourceException.schema("schema list is not JSON: " + e.getMessage());
        }
        return out;
    }

    @Override
    public String name() {
        return "databus(" + plan.identity().sources().get(0) + ")";
    }

    @Override
    public Column[] columns() {
        StructField[] f = plan.schema().fields();
        Column[] out = new Column[f.length];
        for (int i = 0; i < f.length; i++) {
            out[i] = Column.create(f[i].name(), f[i].dataType(), f[i].nullable());
        }
        return out;
    }

    @Override
    public boolean containsCarryoverRows() {
        return false;
    }

    @Override
    public boolean containsIntermediateChanges() {
        return true;
    }

    @Override
    public boolean representsUpdateAsDeleteAndInsert() {
        return false;
    }

    @Override
    public NamedReference[] rowId() {
        return keys.stream().map(Expressions::column).toArray(NamedReference[]::new);
    }

    @Override
    public NamedReference rowVersion() {
        return Expressions.column(DatabusProvider.CHANGE_COLUMNS[1]);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return () -> new DatabusProvider.DatabusScan(plan);
    }
}
