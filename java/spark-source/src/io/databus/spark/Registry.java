package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

/**
 * The table versions a relay's {@code /register} lists: by schema id (the 16-byte MD5
 * digest an event's payload part names) and by source, in version order.
 */
final class Registry {
    private static final ObjectMapper JSON = new ObjectMapper();

    /** One version of one source's schema. */
    record Version(int srcId, String name, int version, byte[] id, AvroType avro, String db, String table) {}

    private final Map<String, Version> byId = new HashMap<>();
    private final Map<Integer, List<Version>> bySrc = new HashMap<>();

    static Registry parse(String json) {
        JsonNode raw;
        try {
            raw = JSON.readTree(json);
        } catch (IOException e) {
            throw DatabusSourceException.schema("schema list is not JSON: " + e.getMessage());
        }
        if (raw == null || !raw.isArray()) {
            throw DatabusSourceException.schema("schema list must be a JSON array");
        }
        Registry r = new Registry();
        for (JsonNode s : raw) {
            if (!s.has("id") || !s.has("name") || !s.has("version") || !s.has("schema")) {
                throw DatabusSourceException.schema("malformed schema entry: " + s);
            }
            String name = s.get("name").asText();
            int dot = name.indexOf('.');
            byte[] id = HexFormat.of().parseHex(s.path("schemaId").asText());
            Version v = new Version(s.get("id").asInt(), name, s.get("version").asInt(), id,
                AvroType.parse(s.get("schema")), dot < 0 ? name : name.substring(0, dot),
                dot < 0 ? "" : name.substring(dot + 1));
            r.byId.put(HexFormat.of().formatHex(id), v);
            r.bySrc.computeIfAbsent(v.srcId(), k -> new ArrayList<>()).add(v);
        }
        r.bySrc.values().forEach(l -> l.sort((a, b) -> Integer.compare(a.version(), b.version())));
        return r;
    }

    Version find(byte[] buf, int off, int len) {
        return byId.get(HexFormat.of().formatHex(buf, off, off + len));
    }

    /** The newest version of a source (the query's row type); UnknownSource when none. */
    Version latest(int srcId) {
        List<Version> l = bySrc.get(srcId);
        if (l == null || l.isEmpty()) {
            throw new DatabusSourceException("UnknownSource", "unknown source id " + srcId);
        }
        return l.get(l.size() - 1);
    }
}
