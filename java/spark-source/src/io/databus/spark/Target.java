package io.databus.spark;

import java.math.BigDecimal;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.NullType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A column's Spark type and the conversion of a decoded value into Spark's internal form.
 *
 * <p>Follows {@code databus.spark.arrow.convert}: a value of the column's own type is taken
 * as it is; a value held in another union branch is converted when the conversion is exact
 * (3 to 3.0, 3.0 to 3, true to 1, a decimal to its text, text to bytes, an int to a
 * decimal), anything else is a {@code SchemaError} naming the column.
 */
final class Target {
    enum Code { NULL, BOOL, INT, LONG, FLOAT, DOUBLE, STRING, BINARY, DECIMAL, DATE, TIMESTAMP, STRUCT,
        ARRAY, MAP }

    final Code code;
    final DataType type;
    final Target[] children;   // struct fields, array element, map value
    final String[] names;      // struct field names

    Target(DataType t) {
        type = t;
        if (t instanceof BooleanType) {
            code = Code.BOOL;
        } else if (t instanceof IntegerType) {
            code = Code.INT;
        } else if (t instanceof LongType) {
            code = Code.LONG;
        } else if (t instanceof FloatType) {
            code = Code.FLOAT;
        } else if (t instanceof DoubleType) {
            code = Code.DOUBLE;
        } else if (t instanceof StringType) {
            code = Code.STRING;
        } else if (t instanceof BinaryType) {
            code = Code.BINARY;
        } else if (t instanceof DecimalType) {
            code = Code.DECIMAL;
        } else if (t instanceof DateType) {
            code = Code.DATE;
        } else if (t instanceof TimestampType || t instanceof TimestampNTZType) {
            code = Code.TIMESTAMP;
        } else if (t instanceof NullType) {
            code = Code.NULL;
        } else if (t instanceof StructType) {
            code = Code.STRUCT;
        } else if (t instanceof ArrayType) {
            code = Code.ARRAY;
        } else if (t instanceof MapType) {
            code = Code.MAP;
        } else {
            throw DatabusSourceException.schema("unsupported column type " + t.simpleString());
        }
        if (code == Code.STRUCT) {
            StructType st = (StructType) t;
            children = new Target[st.fields().length];
            names = st.fieldNames();
            for (int i = 0; i < children.length; i++) {
                children[i] = new Target(st.fields()[i].dataType());
            }
        } else if (code == Code.ARRAY) {
            children = new Target[] {new Target(((ArrayType) t).elementType())};
            names = null;
        } else if (code == Code.MAP) {
            children = new Target[] {new Target(((MapType) t).valueType())};
            names = null;
        } else {
            children = null;
            names = null;
        }
    }

    /** {@code v} (a value {@link AvroType#read} produced) in Spark's internal form. */
    Object convert(Object v, AvroType from, String where) {
        if (v == null) {
            return null;
        }
        switch (code) {
            case LONG:
            case INT: {
                long n;
                if (v instanceof Long l) {
                    n = l;
                } else if (v instanceof Boolean b) {
                    n = b ? 1 : 0;
                } else if (v instanceof AvroType.TimeOfDay t) {
                    n = code == Code.LONG ? t.micros() : Math.floorDiv(t.micros(), 1000);
                } else if (v instanceof Double d && d == Math.rint(d) && !Double.isInfinite(d)
                        && Math.abs(d) < 0x1p63) {
                    n = (long) (double) d;
                } else {
                    throw misfit(v, where);
                }
                if (code == Code.LONG) {
                    return n;
                }
                if (n < Integer.MIN_VALUE || n > Integer.MAX_VALUE) {
                    throw DatabusSourceException.schema("cannot build the Arrow batch: column " + where
                        + ": value " + n + " out of bounds for int32");
                }
                return (int) n;
            }
            case DOUBLE:
            case FLOAT: {
                double d;
                if (v instanceof Double x) {
                    d = x;
                } else if (v instanceof Long l && (double) (long) l == l) {
                    d = (double) (long) l;
                    if ((long) d != l) {
                        throw misfit(v, where);
                    }
                } else {
                    throw misfit(v, where);
                }
                return code == Code.DOUBLE ? (Object) d : (Object) (float) d;
            }
            case STRING:
                if (v instanceof UTF8String) {
                    return v;
                }
                if (v instanceof BigDecimal bd) {
                    return UTF8String.fromString(bd.toString());
                }
                throw misfit(v, where);
            case BINARY:
                if (v instanceof byte[]) {
                    return v;
                }
                if (v instanceof UTF8String s) {
                    return s.getBytes();
                }
                throw misfit(v, where);
            case BOOL:
                if (v instanceof Boolean) {
                    return v;
                }
                throw misfit(v, where);
            case DECIMAL: {
                DecimalType dt = (DecimalType) type;
                BigDecimal bd;
                if (v instanceof BigDecimal x) {
                    bd = x;
                } else if (v instanceof Long l) {
                    bd = BigDecimal.valueOf(l);
                } else {
                    throw misfit(v, where);
                }
                try {
                    bd = bd.setScale(dt.scale());
                } catch (ArithmeticException e) {
                    throw misfit(v, where);
                }
                if (bd.precision() > dt.precision()) {
                    throw misfit(v, where);
                }
                return Decimal.apply(bd, dt.precision(), dt.scale());
            }
            case DATE:
                if (v instanceof AvroType.Days d) {
                    return d.days();
                }
                throw misfit(v, where);
            case TIMESTAMP:
                if (v instanceof AvroType.Micros m) {
                    return m.micros();
                }
                if (v instanceof AvroType.Days d) {
                    return d.days() * 86_400_000_000L;
                }
                throw misfit(v, where);
            case STRUCT: {
                if (!(v instanceof Object[] rec) || from == null || from.kind != AvroType.Kind.RECORD) {
                    throw misfit(v, where);
                }
                Object[] out = new Object[children.length];
                for (int i = 0; i < children.length; i++) {
                    for (int j = 0; j < from.avroNames.length; j++) {
                        if (from.avroNames[j].equals(names[i])) {
                            out[i] = children[i].convert(rec[j], branchOf(from.children[j], rec[j]), where);
                        }
                    }
                }
                return new GenericInternalRow(out);
            }
            case ARRAY: {
                if (!(v instanceof List<?> list)) {
                    throw misfit(v, where);
                }
                AvroType item = from != null && from.kind == AvroType.Kind.ARRAY ? from.children[0] : null;
                Object[] out = new Object[list.size()];
                for (int i = 0; i < out.length; i++) {
                    out[i] = children[0].convert(list.get(i), branchOf(item, list.get(i)), where);
                }
                return new GenericArrayData(out);
            }
            case MAP: {
                if (!(v instanceof Map<?, ?> map)) {
                    throw misfit(v, where);
                }
                AvroType val = from != null && from.kind == AvroType.Kind.MAP ? from.children[0] : null;
                Object[] keys = new Object[map.size()];
                Object[] vals = new Object[map.size()];
                int i = 0;
                for (Map.Entry<?, ?> e : map.entrySet()) {
                    keys[i] = e.getKey();
                    vals[i++] = children[0].convert(e.getValue(), branchOf(val, e.getValue()), where);
                }
                return new ArrayBasedMapData(new GenericArrayData(keys), new GenericArrayData(vals));
            }
            case NULL:
            default:
                throw misfit(v, where);
        }
    }

    /** The record/array/map type inside a union that produced {@code v} (nested values only). */
    private static AvroType branchOf(AvroType t, Object v) {
        if (t == null || t.kind != AvroType.Kind.UNION) {
            return t;
        }
        for (AvroType b : t.children) {
            boolean fits = switch (b.kind) {
                case RECORD -> v instanceof Object[];
                case ARRAY -> v instanceof List;
                case MAP -> v instanceof Map;
                default -> false;
            };
            if (fits) {
                return b;
            }
        }
        return null;
    }

    private DatabusSourceException misfit(Object v, String where) {
        String text = v instanceof byte[] b ? "b'" + AvroReader.text(b) + "'" : String.valueOf(v);
        if (text.length() > 60) {
            text = text.substring(0, 60);
        }
        return DatabusSourceException.schema("column " + where + ": value " + text + " ("
            + v.getClass().getSimpleName() + ") does not fit " + type.simpleString()
            + "; use valueFormat=json to carry any value");
    }
}
