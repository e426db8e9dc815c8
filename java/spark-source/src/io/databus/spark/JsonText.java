package io.databus.spark;

import java.math.BigDecimal;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.ZoneOffset;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * {@code valueFormat=json}: a row image as the Python source writes it
 * ({@code databus.core.envelope.row_to_json} then {@code json.dumps(separators=(",", ":"),
 * ensure_ascii=False)}): the table's column names in field order; numbers as JSON numbers
 * (floats as Python's repr), decimals as plain strings, bytes as base64, dates and times
 * ISO-8601 (timestamps in UTC with a Z), nested values alike.
 */
final class JsonText {
    private JsonText() {}

    static String row(AvroType rec, Object[] values) {
        StringBuilder b = new StringBuilder("{");
        for (int i = 0; i < values.length; i++) {
            if (i > 0) {
                b.append(',');
            }
            string(b, rec.names[i]);
            b.append(':');
            value(b, values[i]);
        }
        return b.append('}').toString();
    }

    private static void value(StringBuilder b, Object v) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof Boolean x) {
            b.append(x ? "true" : "false");
        } else if (v instanceof Long x) {
            b.append(x);
        } else if (v instanceof Double x) {
            b.append(pyRepr(x));
        } else if (v instanceof UTF8String x) {
            string(b, x.toString());
        } else if (v instanceof byte[] x) {
            string(b, Base64.getEncoder().encodeToString(x));
        } else if (v instanceof BigDecimal x) {
            string(b, x.toPlainString());
        } else if (v instanceof AvroType.Days x) {
            string(b, LocalDate.ofEpochDay(x.days()).toString());
        } else if (v instanceof AvroType.Micros x) {
            LocalDateTime t = LocalDateTime.ofEpochSecond(Math.floorDiv(x.micros(), 1_000_000L),
                (int) Math.floorMod(x.micros(), 1_000_000L) * 1000, ZoneOffset.UTC);
            string(b, iso(t.toLocalDate().toString(), t.toLocalTime()) + (x.local() ? "" : "Z"));
        } else if (v instanceof AvroType.TimeOfDay x) {
            string(b, time(LocalTime.ofNanoOfDay(Math.floorMod(x.micros(), 86_400_000_000L) * 1000)));
        } else if (v instanceof Object[] rec) {
            // a nested record: its Avro field names are not kept here; positional keys
            b.append('{');
            for (int i = 0; i < rec.length; i++) {
                b.append(i > 0 ? "," : "").append("\"f").append(i).append("\":");
                value(b, rec[i]);
            }
            b.append('}');
        } else if (v instanceof List<?> l) {
            b.append('[');
            for (int i = 0; i < l.size(); i++) {
                b.append(i > 0 ? "," : "");
                value(b, l.get(i));
            }
            b.append(']');
        } else if (v instanceof Map<?, ?> m) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                b.append(first ? "" : ",");
                first = false;
                string(b, e.getKey().toString());
                b.append(':');
                value(b, e.getValue());
            }
            b.append('}');
        } else {
            string(b, v.toString());
        }
    }

    private static String iso(String date, LocalTime t) {
        return date + "T" + time(t);
    }

    /** Python's time.isoformat(): HH:MM:SS, then .ffffff when there are microseconds. */
    private static String time(LocalTime t) {
        String s = String.format("%02d:%02d:%02d", t.getHour(), t.getMinute(), t.getSecond());
        int micros = t.getNano() / 1000;
        return micros == 0 ? s : s + String.format(".%06d", micros);
    }

    /** Python's repr of a float (what json.dumps writes). */
    static String pyRepr(double d) {
        if (Double.isNaN(d)) {
            return "NaN";
        }
        if (Double.isInfinite(d)) {
            return d > 0 ? "Infinity" : "-Infinity";
        }
        if (d == 0) {
            return (1 / d < 0) ? "-0.0" : "0.0";
        }
        BigDecimal bd = new BigDecimal(Double.toString(Math.abs(d))).stripTrailingZeros();
        String digits = bd.unscaledValue().toString();
        int exp = digits.length() - bd.scale() - 1;  // decimal exponent of the first digit
        StringBuilder b = new StringBuilder(d < 0 ? "-" : "");
        if (exp >= -5 + 1 && exp < 16) {
            if (exp >= 0) {
                if (digits.length() <= exp + 1) {
                    b.append(digits).append("0".repeat(exp + 1 - digits.length())).append(".0");
                } else {
                    b.append(digits, 0, exp + 1).append('.').append(digits, exp + 1, digits.length());
                }
            } else {
                b.append("0.").append("0".repeat(-exp - 1)).append(digits);
            }
        } else {
            b.append(digits.charAt(0));
            if (digits.length() > 1) {
                b.append('.').append(digits, 1, digits.length());
            }
            b.append('e').append(exp < 0 ? '-' : '+').append(String.format("%02d", Math.abs(exp)));
        }
        return b.toString();
    }

    static void string(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                case '\b': b.append("\\b"); break;
                case '\f': b.append("\\f"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }
}
