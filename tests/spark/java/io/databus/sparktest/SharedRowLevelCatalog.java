package io.databus.sparktest;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.InMemoryRowLevelOperationTableCatalog;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * For the suite only: Spark's in-memory catalog whose tables support row-level operations
 * (MERGE), from Spark's test jar, with one table map per catalog name for the whole JVM.
 *
 * <p>Spark makes a new catalog instance for every session, and a pipeline run uses several
 * (its flows, each streaming query's clone, each {@code foreachBatch}); Spark's own class
 * keeps its tables per instance, so an AUTO CDC flow would not find the auxiliary table it
 * had created. Sharing the map makes the catalog behave as a real one does. The tables
 * live as long as the JVM (one {@code spark-pipelines run}).
 */
public class SharedRowLevelCatalog extends InMemoryRowLevelOperationTableCatalog {
    private static final Map<String, Map<Identifier, Table>> TABLES = new ConcurrentHashMap<>();

    @Override
    public void initialize(String name, CaseInsensitiveStringMap options) {
        super.initialize(name, options);
        tables_$eq(TABLES.computeIfAbsent(name, n -> new ConcurrentHashMap<>()));
    }
}
