package io.databus.spark;

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Writes one Avro value of a table column into a slot of a Spark column vector: the value
 * the row reader would put in that column ({@link AvroType#read} then {@link Target#convert}),
 * the same errors in the same cases.
 *
 * <p>{@link #of} builds a writer per (Avro type, column): a nullable union reads its branch
 * and writes a null or the branch's value; a branch whose value needs no conversion (an
 * int or long into an integer column, float/double into float/double, a string into a
 * string column straight from the event's bytes, bytes into binary, boolean, date,
 * timestamp) is decoded into the vector without an object per value; any other (decimals,
 * enums, fixed, nested records, arrays and maps, a value in another union branch than its
 * column's type) is decoded and converted as the row reader does, then written by
 * {@link #value}.
 */
@FunctionalInterface
interface VectorPut {
    void put(AvroReader in, WritableColumnVector v, int row);

    VectorPut NULL = (in, v, row) -> v.putNull(row);

    /** The writer of Avro type {@code t} into a column of {@code target} (named {@code col} in errors). */
    static VectorPut of(AvroType t, Target target, String col) {
        if (t.kind == AvroType.Kind.UNION) {
            AvroType from = RowDecoder.natural(t, null);  // what the row reader converts nested values from
            VectorPut[] branches = new VectorPut[t.children.length];
            for (int i = 0; i < branches.length; i++) {
                AvroType b = t.children[i];
                branches[i] = b.kind == AvroType.Kind.NULL ? NULL : direct(b, target, col, from);
            }
            return (in, v, row) -> {
                long b = in.zlong();
                if (b < 0 || b >= branches.length) {
                    throw in.bad("union branch " + b);
                }
                branches[(int) b].put(in, v, row);
            };
        }
        return direct(t, target, col, t);
    }

    private static VectorPut direct(AvroType t, Target target, String col, AvroType from) {
        Target.Code c = target.code;
        switch (t.kind) {
            case INT: case LONG:
                if (c == Target.Code.LONG) {
                    return (in, v, row) -> v.putLong(row, in.zlong());
                }
                if (c == Target.Code.INT) {
                    return (in, v, row) -> {
                        long n = in.zlong();
                        if (n < Integer.MIN_VALUE || n > Integer.MAX_VALUE) {
                            throw DatabusSourceException.schema("cannot build the Arrow batch: column " + col
                                + ": value " + n + " out of bounds for int32");
                        }
                        v.putInt(row, (int) n);
                    };
                }
                break;
            case FLOAT:
                if (c == Target.Code.DOUBLE) {
                    return (in, v, row) -> v.putDouble(row, in.float32());
                }
                if (c == Target.Code.FLOAT) {
                    return (in, v, row) -> v.putFloat(row, in.float32());
                }
                break;
            case DOUBLE:
                if (c == Target.Code.DOUBLE) {
                    return (in, v, row) -> v.putDouble(row, in.float64());
                }
                if (c == Target.Code.FLOAT) {
                    return (in, v, row) -> v.putFloat(row, (float) in.float64());
                }
                break;
            case STRING:
                if (c == Target.Code.STRING) {
                    return (in, v, row) -> {
                        int n = in.utf8Span();
                        v.putByteArray(row, in.buf, in.pos - n, n);
                    };
                }
                break;
            case BYTES:
                if (c == Target.Code.BINARY) {
                    return (in, v, row) -> {
                        int n = in.span();
                        v.putByteArray(row, in.buf, in.pos - n, n);
                    };
                }
                break;
            case BOOLEAN:
                if (c == Target.Code.BOOL) {
                    return (in, v, row) -> v.putBoolean(row, in.bool());
                }
                break;
            case DATE:
                if (c == Target.Code.DATE) {
                    return (in, v, row) -> v.putInt(row, (int) in.zlong());
                }
                break;
            case TIMESTAMP: case LOCAL_TIMESTAMP:
                if (c == Target.Code.TIMESTAMP) {
                    long unit = t.unitMicros;
                    return (in, v, row) -> {
                        long x = in.zlong();
                        v.putLong(row, unit > 0 ? x * unit : Math.floorDiv(x, -unit));
                    };
                }
                break;
            default:
                break;
        }
        return (in, v, row) -> value(v, row, target.convert(t.read(in), from, col), target);
    }

    /** Writes {@code x}, a value in Spark's internal form of {@code t}'s type ({@link Target#convert}). */
    static void value(WritableColumnVector v, int row, Object x, Target t) {
        if (x == null) {
            v.putNull(row);
            return;
        }
        switch (t.code) {
            case BOOL: v.putBoolean(row, (Boolean) x); break;
            case INT: case DATE: v.putInt(row, (Integer) x); break;
            case LONG: case TIMESTAMP: v.putLong(row, (Long) x); break;
            case FLOAT: v.putFloat(row, (Float) x); break;
            case DOUBLE: v.putDouble(row, (Double) x); break;
            case STRING: utf8(v, row, (UTF8String) x); break;
            case BINARY: {
                byte[] b = (byte[]) x;
                v.putByteArray(row, b, 0, b.length);
                break;
            }
            case DECIMAL: v.putDecimal(row, (Decimal) x, ((DecimalType) t.type).precision()); break;
            case STRUCT: {
                Object[] fields = ((GenericInternalRow) x).values();
                for (int i = 0; i < fields.length; i++) {
                    value(v.getChild(i), row, fields[i], t.children[i]);
                }
                break;
            }
            case ARRAY: {
                Object[] items = ((GenericArrayData) x).array();
                WritableColumnVector e = v.arrayData();
                int off = e.getElementsAppended();
                reserve(e, off + items.length);
                for (int i = 0; i < items.length; i++) {
                    value(e, off + i, items[i], t.children[0]);
                }
                e.addElementsAppended(items.length);
                v.putArray(row, off, items.length);
                break;
            }
            case MAP: {
                ArrayBasedMapData m = (ArrayBasedMapData) x;
                Object[] keys = ((GenericArrayData) m.keyArray()).array();
                Object[] vals = ((GenericArrayData) m.valueArray()).array();
                WritableColumnVector kv = v.getChild(0);
                WritableColumnVector vv = v.getChild(1);
                int off = kv.getElementsAppended();
                reserve(kv, off + keys.length);
                reserve(vv, off + keys.length);
                for (int i = 0; i < keys.length; i++) {
                    utf8(kv, off + i, (UTF8String) keys[i]);
                    value(vv, off + i, vals[i], t.children[0]);
                }
                kv.addElementsAppended(keys.length);
                vv.addElementsAppended(keys.length);
                v.putArray(row, off, keys.length);
                break;
            }
            case NULL:
            default:
                v.putNull(row);
        }
    }

    /** Room for {@code capacity} elements in {@code v} and, for a struct, in each field's vector. */
    private static void reserve(WritableColumnVector v, int capacity) {
        v.reserve(capacity);
        if (v.dataType() instanceof StructType) {
            for (int i = 0; i < v.getNumChildren(); i++) {
                reserve(v.getChild(i), capacity);
            }
        }
    }

    /** A string (null: a null slot), copied from where it lies. */
    static void utf8(WritableColumnVector v, int row, UTF8String s) {
        if (s == null) {
            v.putNull(row);
        } else if (s.getBaseObject() instanceof byte[] b) {
            v.putByteArray(row, b, (int) (s.getBaseOffset() - Platform.BYTE_ARRAY_OFFSET), s.numBytes());
        } else {
            byte[] b = s.getBytes();
            v.putByteArray(row, b, 0, b.length);
        }
    }
}
