package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.StringJoiner;
import javax.net.ssl.KeyManager;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;

/**
 * A relay's HTTP API as a client uses it: {@code /sources}, {@code /register},
 * {@code /stream?output=binary}. The Java twin of {@code databus.client.relay.RelayConnection}:
 *
 * <ul>
 *   <li>{@code relay} is a URL or a comma-separated list of them; after a failure the next
 *       call goes to the next one (every member holds the same windows);
 *   <li>the bearer token comes from {@code tokenFile}, else {@code DATABUS_TOKEN}, else the
 *       file named by {@code DATABUS_TOKEN_FILE} (read at each new client, so a rotated
 *       token is picked up); {@code https://} is verified against {@code caFile}, else
 *       {@code DATABUS_CA_FILE}, else the JVM's CAs, never unverified;
 *   <li>no connection, a timeout or any 5xx is a transient {@code RelayUnavailable}; a 4xx
 *       with the relay's JSON body {@code {"error": code, "message": ...}} keeps the code;
 *   <li>{@code relay} may be a relay cluster's address {@code zk://HOST:PORT/NAME}: its live
 *     members from ZooKeeper ({@link ZkCluster}), the leader first, read again after a
 *     member failed;
 * <li>mutual TLS: the client certificate and key from {@code certFile}/{@code keyFile}, else
 *     {@code DATABUS_CERT_FILE}/{@code DATABUS_KEY_FILE} (PEM, {@link PemKeys}).
 * </ul>
 */
final class RelayClient {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Map<String, HttpClient> CLIENTS = new HashMap<>();
    /** The name requests give the relay by default (X-Databus-Consumer: GET /consumers, docs/operations.md). */
    static final String CONSUMER = "spark-jvm@" + hostName();

    /** A {@code /stream} body and the relay's newest window ({@code X-Databus-Max-Scn}). */
    record Response(byte[] data, long maxScn) {}

    /** The sources the relay serves this token and its {@code Databus-Origin} (null: none sent). */
    record Catalog(List<Map.Entry<Integer, String>> sources, String origin) {}

    static final String ORIGIN_HEADER = "Databus-Origin";

    private final List<String> urls;
    private int current;
    private final String token;
    private final HttpClient http;
    private final Duration httpTimeout;

    private final String what;  // "relay" or "bootstrap server", for messages
    private String consumer = CONSUMER;  // the source's consumerName option, when given
    private final ZkCluster cluster;  // a zk:// address: its members are urls

    RelayClient(SourceOptions o) {
        this(o.relay, "relay", "databus source", "relay", o.tokenFile, o.caFile, o.certFile, o.keyFile,
            o.httpTimeout);
        if (o.consumerName != null) {
            consumer = o.consumerName;
        }
    }

    /**
     * A client of {@code spec} (URLs as above) answering like a relay; {@code what} names the
     * server in messages, {@code who} the reader and {@code option} its address option.
     */
    RelayClient(String spec, String what, String who, String option, String tokenFile, String caFile,
                String certFile, String keyFile, double timeoutSeconds) {
        this.what = what;
        spec = spec.strip();
        urls = new ArrayList<>();
        timeoutSeconds = timeoutSeconds > 0 ? timeoutSeconds : 10.0;
        if (spec.startsWith("zk://") && what.equals("relay")) {
            cluster = ZkCluster.parse(spec, who, option);
            urls.addAll(cluster.urls(timeoutSeconds, false));
        } else {
            cluster = null;
        }
        for (String u : cluster != null ? new String[0] : spec.split(",")) {
            String t = u.strip();
            while (t.endsWith("/")) {
                t = t.substring(0, t.length() - 1);
            }
            if (!t.startsWith("http://") && !t.startsWith("https://")) {
                throw DatabusSourceException.config(who + ": invalid options: " + option + ": a " + what
                    + " is an http:// or https:// URL, a comma-separated list of them"
                    + (what.equals("relay") ? ", or a cluster address zk://HOST:PORT/NAME" : ""));
            }
            urls.add(t);
        }
        String cert = orEnv(certFile, "DATABUS_CERT_FILE");
        String key = orEnv(keyFile, "DATABUS_KEY_FILE");
        if ((cert == null) != (key == null)) {
            throw DatabusSourceException.config(who + ": a client certificate needs both files: certFile "
                + "and keyFile (or DATABUS_CERT_FILE and DATABUS_KEY_FILE)");
        }
        token = token(tokenFile);
        httpTimeout = Duration.ofMillis((long) (timeoutSeconds * 1000));
        http = client(orEnv(caFile, "DATABUS_CA_FILE"), cert, key, httpTimeout);
    }

    private static String orEnv(String option, String env) {
        String v = option != null ? option : System.getenv(env);
        return v == null || v.isEmpty() ? null : v;
    }

    String url() {
        return urls.get(current);
    }

    private static String token(String tokenFile) {
        String file = tokenFile;
        if (file == null) {
            String t = System.getenv("DATABUS_TOKEN");
            if (t != null && !t.isEmpty()) {
                return t;
            }
            file = System.getenv("DATABUS_TOKEN_FILE");
            if (file == null || file.isEmpty()) {
                return null;
            }
        }
        String text;
        try {
            text = Files.readString(Path.of(file), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw DatabusSourceException.config("cannot read token file " + file + ": " + e.getMessage());
        }
        for (String line : text.split("\\R")) {
            if (!line.strip().isEmpty()) {
                return line.strip();
            }
        }
        throw DatabusSourceException.config("token file " + file + " is empty");
    }

    /** One client per TLS files (and their modification times): a CA store costs tens of ms. */
    private static HttpClient client(String caFile, String certFile, String keyFile, Duration timeout) {
        StringBuilder key = new StringBuilder();
        for (String f : new String[] {caFile, certFile, keyFile}) {
            try {
                key.append(f == null ? "" : f + "@" + Files.getLastModifiedTime(Path.of(f)).toMillis()).append('|');
            } catch (IOException e) {
                throw DatabusSourceException.config("client TLS files unusable: " + e + " (" + f + ")");
            }
        }
        key.append(timeout.toMillis());
        synchronized (CLIENTS) {
            HttpClient c = CLIENTS.get(key.toString());
            if (c == null) {
                HttpClient.Builder b = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
                    .connectTimeout(timeout);
                if (caFile != null || certFile != null) {
                    b.sslContext(sslContext(caFile, certFile, keyFile));
                }
                c = b.build();
                CLIENTS.put(key.toString(), c);
            }
            return c;
        }
    }

    /** Trust: {@code caFile}'s certificates, else the JVM's CAs; a client certificate when given. */
    private static SSLContext sslContext(String caFile, String certFile, String keyFile) {
        try {
            TrustManager[] trust = null;  // null: the JVM's default CAs
            if (caFile != null) {
                KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
                ks.load(null, null);
                int i = 0;
                try (InputStream in = Files.newInputStream(Path.of(caFile))) {
                    for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                        ks.setCertificateEntry("ca" + i++, c);
                    }
                }
                TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
                tmf.init(ks);
                trust = tmf.getTrustManagers();
            }
            KeyManager[] keys = certFile != null ? PemKeys.keyManagers(certFile, keyFile) : null;
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(keys, trust, null);
            return ctx;
        } catch (Exception e) {
            throw DatabusSourceException.config("client TLS files unusable: " + e.getMessage() + " ("
                + (caFile != null ? caFile : "") + (certFile != null ? " " + certFile + " " + keyFile : "") + ")");
        }
    }

    /** {@code (id, "db.table")} of every source the relay serves. */
    List<Map.Entry<Integer, String>> sources() {
        return catalog().sources();
    }

    /** {@link #sources()} and the relay's origin: what it captures ({@code Databus-Origin}). */
    Catalog catalog() {
        HttpResponse<byte[]> r = get("/sources", Map.of(), null);
        String origin = r.headers().firstValue(ORIGIN_HEADER).map(String::strip).filter(v -> !v.isEmpty())
            .orElse(null);
        JsonNode raw;
        try {
            raw = JSON.readTree(r.body());
        } catch (IOException e) {
            throw unavailable(url() + "/sources did not answer JSON", null);
        }
        if (!raw.isArray()) {
            throw unavailable(url() + "/sources did not answer a JSON list", null);
        }
        List<Map.Entry<Integer, String>> out = new ArrayList<>();
        for (JsonNode s : raw) {
            if (!s.has("id") || !s.has("name")) {
                throw unavailable(url() + "/sources answered malformed entries", null);
            }
            out.add(Map.entry(s.get("id").asInt(), s.get("name").asText()));
        }
        return new Catalog(out, origin);
    }

    /**
     * Throws a {@code Forbidden} (or {@code Unauthorized}) error when the relay says that
     * {@code wanted}, missing from this token's {@code /sources}, is a source the token may not
     * read: asked by itself ({@code /register} for an id, {@code /sources?names=} for a name),
     * a relay answers 403 for it. Returns when the relay does not know it (or cannot say).
     */
    void refused(String wanted) {
        try {
            if (!wanted.isEmpty() && wanted.chars().allMatch(Character::isDigit)) {
                register(List.of(Integer.parseInt(wanted)));
            } else {
                get("/sources", Map.of("names", wanted), null);
            }
        } catch (NumberFormatException e) {
            return;  // an id too large to be one
        } catch (DatabusSourceException e) {
            if (e.code().equals("Forbidden") || e.code().equals("Unauthorized")) {
                throw new DatabusSourceException(e.code(), "databus source: the relay " + url()
                    + " refuses source '" + wanted + "' to this token: " + e.getMessage(), false, e);
            }
        }
    }

    /** The JSON list of every schema version of {@code ids}. */
    String register(List<Integer> ids) {
        Map<String, String> p = new LinkedHashMap<>();
        p.put("sources", join(ids));
        return new String(get("/register", p, null).body(), StandardCharsets.UTF_8);
    }

    /**
     * The relay's event buffer as {@code /containerStats/buffer} reports it (all sources):
     * {@code used_bytes}, {@code events}, {@code windows}, {@code min_scn}, {@code max_scn}.
     */
    JsonNode bufferStats() {
        try {
            JsonNode b = JSON.readTree(get("/containerStats/buffer", Map.of(), null).body());
            if (b == null || !b.isObject()) {
                throw unavailable(url() + "/containerStats/buffer did not answer a JSON object", null);
            }
            return b;
        } catch (IOException e) {
            throw unavailable(url() + "/containerStats/buffer did not answer JSON", e);
        }
    }

    /** Windows after {@code checkpoint} (null: the oldest), long-polling {@code timeout} s. */
    Response stream(String checkpoint, List<Integer> ids, int size, String filter, double timeout) {
        return stream(checkpoint, ids, size, filter, timeout, -1);
    }

    /**
     * As {@link #stream(String, List, int, String, double)}; with {@code newestUpTo} >= 0, no
     * window past that SCN and each key's last event of the answer only ({@code uptoScn},
     * {@code newest=true}: the relay's reduction, docs/relay.md). A relay without them
     * ignores both and answers every event, which a caller reducing by key must accept.
     */
    Response stream(String checkpoint, List<Integer> ids, int size, String filter, double timeout,
                    long newestUpTo) {
        Map<String, String> p = new LinkedHashMap<>();
        if (newestUpTo >= 0) {
            p.put("uptoScn", Long.toString(newestUpTo));
            p.put("newest", "true");
        }
        p.put("size", Integer.toString(size));
        p.put("output", "binary");
        p.put("timeout", Double.toString(timeout));
        p.put("sources", join(ids));
        if (checkpoint != null) {
            p.put("checkPoint", checkpoint);
        }
        if (filter != null) {
            p.put("filters", filter);
        }
        Duration read = httpTimeout.plusMillis((long) (timeout * 1000));
        HttpResponse<byte[]> r;
        Set<String> tried = new HashSet<>();
        while (true) {
            try {
                r = get("/stream", p, read);
                break;
            } catch (DatabusSourceException e) {
                // members hold the same windows, not equally far back (one that has just
                // dropped its buffer, or a smaller one): the position is lost only when
                // no member holds it
                if (!"ScnNotFound".equals(e.code())) {
                    throw e;
                }
                tried.add(url());
                failedOver(tried);
                if (tried.contains(url())) {
                    throw e;
                }
            }
        }
        long max = r.headers().firstValue("X-Databus-Max-Scn").map(v -> {
            try {
                return Long.parseLong(v);
            } catch (NumberFormatException e) {
                return -1L;
            }
        }).orElse(-1L);
        return new Response(r.body(), max);
    }

    private static String join(List<Integer> ids) {
        StringJoiner j = new StringJoiner(",");
        ids.forEach(i -> j.add(Integer.toString(i)));
        return j.toString();
    }

    /** GET {@code path?params} (read timeout {@code read}, null: httpTimeout); errors as above. */
    HttpResponse<byte[]> get(String path, Map<String, String> params, Duration read) {
        StringBuilder q = new StringBuilder(url()).append(path);
        char sep = '?';
        for (Map.Entry<String, String> e : params.entrySet()) {
            q.append(sep).append(e.getKey()).append('=')
                .append(URLEncoder.encode(e.getValue(), StandardCharsets.UTF_8));
            sep = '&';
        }
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(q.toString()))
            .timeout(read != null ? read : httpTimeout).header("User-Agent", "databus-spark-jvm")
            .header("X-Databus-Consumer", consumer).GET();
        if (token != null) {
            b.header("Authorization", "Bearer " + token);
        }
        HttpResponse<byte[]> r;
        try {
            r = http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (IOException e) {
            DatabusSourceException err = unavailable(what + " " + url() + " unreachable (" + path + "): "
                + e.getClass().getSimpleName() + ": " + e.getMessage(), e);
            failedOver();
            throw err;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw unavailable("interrupted while reading " + what + " " + url() + path, e);
        }
        if (r.statusCode() >= 400) {
            throw error(path, r);
        }
        return r;
    }

    /** The member to try after the current one failed: the next URL of a list; for a
     * cluster, its members read again, another one than the failed one when there is one. */
    private void failedOver() {
        failedOver(Set.of());
    }

    /** As {@link #failedOver()}, to a member not in {@code avoid} when there is one. */
    private void failedOver(Set<String> avoid) {
        if (cluster == null) {
            int next = (current + 1) % urls.size();
            for (int k = 1; k <= urls.size(); k++) {
                int i = (current + k) % urls.size();
                if (!avoid.contains(urls.get(i))) {
                    next = i;
                    break;
                }
            }
            current = next;
            return;
        }
        String failed = urls.get(current);
        List<String> live;
        try {
            live = cluster.urls(httpTimeout.toMillis() / 1000.0, true);
        } catch (DatabusSourceException e) {
            current = (current + 1) % urls.size();  // ZooKeeper down too: the members known
            return;
        }
        urls.clear();
        urls.addAll(live);
        current = 0;
        int other = -1;
        for (int i = 0; i < urls.size(); i++) {
            if (!urls.get(i).equals(failed)) {
                if (other < 0) {
                    other = i;
                }
                if (!avoid.contains(urls.get(i))) {
                    current = i;
                    return;
                }
            }
        }
        current = Math.max(other, 0);
    }

    private DatabusSourceException error(String path, HttpResponse<byte[]> r) {
        String text = new String(r.body(), StandardCharsets.UTF_8);
        String code = "";
        String message = text.length() > 500 ? text.substring(0, 500) : text;
        try {
            JsonNode body = JSON.readTree(r.body());
            if (body != null && body.isObject()) {
                code = body.path("error").asText("");
                message = body.path("message").asText(message);
            }
        } catch (IOException e) {
            // not JSON: the text is the message
        }
        String where = what + " " + url() + path + " answered " + r.statusCode();
        if (r.statusCode() >= 500) {
            failedOver();
            return new DatabusSourceException(code.isEmpty() ? "RelayUnavailable" : code,
                where + ": " + (code.isEmpty() ? "error" : code) + ": " + message, true, null);
        }
        if (!code.isEmpty()) {
            return new DatabusSourceException(code, message);
        }
        return new DatabusSourceException("TerminalError", where + ": " + message);
    }

    private static DatabusSourceException unavailable(String message, Throwable cause) {
        return new DatabusSourceException("RelayUnavailable", message, true, cause);
    }

    private static String hostName() {
        try {
            return java.net.InetAddress.getLocalHost().getHostName();
        } catch (IOException e) {
            return "unknown-host";  // a consumer name only: never worth failing a read
        }
    }
}
