package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * An Avro type of a table schema, parsed from the relay's JSON, with its binary decoder
 * and its Spark type. The Spark type is what the Python source declares: its Arrow type
 * ({@code databus.spark.arrow.avro_to_arrow}) as PySpark maps it. A nullable union takes
 * its first non-null branch; decimal becomes DecimalType (string above 38 digits); date
 * DateType; every timestamp TimestampType (microseconds as stored); time-millis/micros
 * int/long; uuid and enum string; fixed binary; arrays, maps and records nest.
 *
 * <p>{@link #read} decodes one value to a "natural" Java value (what fastavro gives the
 * Python source): {@code Boolean}, {@code Long} (int and long), {@code Double} (float and
 * double), {@link UTF8String} (string, uuid, enum), {@code byte[]} (bytes, fixed),
 * {@link BigDecimal}, {@link Days}, {@link Micros}, {@link TimeOfDay}, {@code Object[]}
 * (record, Avro field order), {@code List}, {@code Map}; {@link Target} then converts it.
 */
final class AvroType {
    enum Kind { NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, STRING, BYTES, DECIMAL, DATE, TIMESTAMP,
        LOCAL_TIMESTAMP, TIME_MILLIS, TIME_MICROS, RECORD, ARRAY, MAP, ENUM, FIXED, UNION }

    /** A date: days since the epoch. */
    record Days(int days) {}

    /** A timestamp in microseconds since the epoch ({@code local}: without a time zone). */
    record Micros(long micros, boolean local) {}

    /** A time of day in microseconds. */
    record TimeOfDay(long micros) {}

    final Kind kind;
    final AvroType[] children;   // union branches, record field types, array items, map values
    final String[] names;        // record: column names (the "column" attribute, else the name)
    final String[] avroNames;    // record: Avro field names
    final String[] symbols;      // enum
    final int precision;
    final int scale;
    final int size;              // fixed size; decimal over fixed: its size (else -1)
    final long unitMicros;       // timestamp: micros per stored unit (millis 1000, micros 1); nanos: -1000

    private AvroType(Kind kind, AvroType[] children, String[] names, String[] avroNames, String[] symbols,
                     int precision, int scale, int size, long unitMicros) {
        this.kind = kind;
        this.children = children;
        this.names = names;
        this.avroNames = avroNames;
        this.symbols = symbols;
        this.precision = precision;
        this.scale = scale;
        this.size = size;
        this.unitMicros = unitMicros;
    }

    private static AvroType simple(Kind k) {
        return new AvroType(k, null, null, null, null, 0, 0, -1, 1);
    }

    static AvroType parse(JsonNode n) {
        if (n.isArray()) {
            AvroType[] branches = new AvroType[n.size()];
            for (int i = 0; i < n.size(); i++) {
                branches[i] = parse(n.get(i));
            }
            return new AvroType(Kind.UNION, branches, null, null, null, 0, 0, -1, 1);
        }
        if (n.isTextual()) {
            switch (n.asText()) {
                case "null": return simple(Kind.NULL);
                case "boolean": return simple(Kind.BOOLEAN);
                case "int": return simple(Kind.INT);
                case "long": return simple(Kind.LONG);
                case "float": return simple(Kind.FLOAT);
                case "double": return simple(Kind.DOUBLE);
                case "string": return simple(Kind.STRING);
                case "bytes": return simple(Kind.BYTES);
                default:
                    throw DatabusSourceException.schema(
                        "named Avro type references are not supported: '" + n.asText() + "'");
            }
        }
        String type = n.path("type").asText("");
        String logical = n.path("logicalType").asText("");
        switch (logical) {
            case "decimal":
                return new AvroType(Kind.DECIMAL, null, null, null, null, n.path("precision").asInt(),
                    n.path("scale").asInt(0), type.equals("fixed") ? n.path("size").asInt() : -1, 1);
            case "date": return simple(Kind.DATE);
            case "timestamp-millis": return ts(Kind.TIMESTAMP, 1000);
            case "timestamp-micros": return ts(Kind.TIMESTAMP, 1);
            case "timestamp-nanos": return ts(Kind.TIMESTAMP, -1000);
            case "local-timestamp-millis": return ts(Kind.LOCAL_TIMESTAMP, 1000);
            case "local-timestamp-micros": return ts(Kind.LOCAL_TIMESTAMP, 1);
            case "local-timestamp-nanos": return ts(Kind.LOCAL_TIMESTAMP, -1000);
            case "time-millis": return simple(Kind.TIME_MILLIS);
            case "time-micros": return simple(Kind.TIME_MICROS);
            default: break;
        }
        switch (type) {
            case "record": {
                JsonNode fields = n.path("fields");
                AvroType[] types = new AvroType[fields.size()];
                String[] cols = new String[fields.size()];
                String[] avro = new String[fields.size()];
                for (int i = 0; i < fields.size(); i++) {
                    JsonNode f = fields.get(i);
                    types[i] = parse(f.get("type"));
                    avro[i] = f.path("name").asText();
                    cols[i] = f.has("column") ? f.get("column").asText() : avro[i];
                }
                return new AvroType(Kind.RECORD, types, cols, avro, null, 0, 0, -1, 1);
            }
            case "array":
                return new AvroType(Kind.ARRAY, new AvroType[] {parse(n.get("items"))}, null, null, null, 0, 0, -1, 1);
            case "map":
                return new AvroType(Kind.MAP, new AvroType[] {parse(n.get("values"))}, null, null, null, 0, 0, -1, 1);
            case "enum": {
                JsonNode s = n.path("symbols");
                String[] symbols = new String[s.size()];
                for (int i = 0; i < s.size(); i++) {
                    symbols[i] = s.get(i).asText();
                }
                return new AvroType(Kind.ENUM, null, null, null, symbols, 0, 0, -1, 1);
            }
            case "fixed":
                return new AvroType(Kind.FIXED, null, null, null, null, 0, 0, n.path("size").asInt(), 1);
            default:
                return parse(n.get("type"));  // {"type": "long"} and logical types we keep raw (uuid)
        }
    }

    private static AvroType ts(Kind k, long unit) {
        return new AvroType(k, null, null, null, null, 0, 0, -1, unit);
    }

    /** The Spark type the Python source declares for this Avro type. */
    DataType sparkType() {
        switch (kind) {
            case NULL: return DataTypes.NullType;
            case BOOLEAN: return DataTypes.BooleanType;
            case INT: case TIME_MILLIS: return DataTypes.IntegerType;
            case LONG: case TIME_MICROS: return DataTypes.LongType;
            case FLOAT: return DataTypes.FloatType;
            case DOUBLE: return DataTypes.DoubleType;
            case STRING: case ENUM: return DataTypes.StringType;
            case BYTES: case FIXED: return DataTypes.BinaryType;
            case DECIMAL:
                return precision <= 38 ? DataTypes.createDecimalType(precision, scale) : DataTypes.StringType;
            case DATE: return DataTypes.DateType;
            case TIMESTAMP: return DataTypes.TimestampType;
            // as the Python source's Arrow schema maps a zone-less timestamp on this line
            case LOCAL_TIMESTAMP:
                return Line.LOCAL_TIMESTAMP_NTZ ? DataTypes.TimestampNTZType : DataTypes.TimestampType;
            case ARRAY: return new ArrayType(children[0].sparkType(), true);
            case MAP: return DataTypes.createMapType(DataTypes.StringType, children[0].sparkType(), true);
            case RECORD: {
                StructField[] fields = new StructField[children.length];
                for (int i = 0; i < children.length; i++) {
                    fields[i] = new StructField(names[i], children[i].sparkType(), true, Metadata.empty());
                }
                return new StructType(fields);
            }
            case UNION: {
                for (AvroType b : children) {
                    if (b.kind != Kind.NULL) {
                        return b.sparkType();
                    }
                }
                return DataTypes.NullType;
            }
            default: throw new IllegalStateException(kind.name());
        }
    }

    /** Whether every value of this type is a primitive the hot path decodes straight. */
    boolean isUnion() {
        return kind == Kind.UNION;
    }

    /** Decodes one value (see the class comment); malformed input is a SchemaError. */
    Object read(AvroReader in) {
        switch (kind) {
            case NULL: return null;
            case BOOLEAN: return in.bool();
            case INT: case LONG: return in.zlong();
            case FLOAT: return (double) in.float32();
            case DOUBLE: return in.float64();
            case STRING: return in.utf8();
            case BYTES: return in.bytes();
            case FIXED: return in.fixed(size);
            case ENUM: {
                long i = in.zlong();
                if (i < 0 || i >= symbols.length) {
                    throw in.bad("enum index " + i);
                }
                return UTF8String.fromString(symbols[(int) i]);
            }
            case DECIMAL: {
                byte[] b = size >= 0 ? in.fixed(size) : in.bytes();
                BigInteger unscaled = b.length == 0 ? BigInteger.ZERO : new BigInteger(b);
                return new BigDecimal(unscaled, scale);
            }
            case DATE: return new Days((int) in.zlong());
            case TIMESTAMP: case LOCAL_TIMESTAMP: {
                long v = in.zlong();
                long micros = unitMicros > 0 ? v * unitMicros : Math.floorDiv(v, -unitMicros);
                return new Micros(micros, kind == Kind.LOCAL_TIMESTAMP);
            }
            case TIME_MILLIS: return new TimeOfDay(in.zlong() * 1000);
            case TIME_MICROS: return new TimeOfDay(in.zlong());
            case UNION: {
                long b = in.zlong();
                if (b < 0 || b >= children.length) {
                    throw in.bad("union branch " + b);
                }
                return children[(int) b].read(in);
            }
            case RECORD: {
                Object[] out = new Object[children.length];
                for (int i = 0; i < children.length; i++) {
                    out[i] = children[i].read(in);
                }
                return out;
            }
            case ARRAY: {
                List<Object> out = new ArrayList<>();
                for (long n = in.blockCount(); n != 0; n = in.blockCount()) {
                    for (long i = 0; i < n; i++) {
                        out.add(children[0].read(in));
                    }
                }
                return out;
            }
            case MAP: {
                Map<UTF8String, Object> out = new LinkedHashMap<>();
                for (long n = in.blockCount(); n != 0; n = in.blockCount()) {
                    for (long i = 0; i < n; i++) {
                        UTF8String k = in.utf8();
                        out.put(k, children[0].read(in));
                    }
                }
                return out;
            }
            default: throw new IllegalStateException(kind.name());
        }
    }
}
