package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.WatchedEvent;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooKeeper;

/**
 * A relay cluster's address {@code zk://HOST:PORT[,HOST:PORT...]/NAME} and its live members,
 * read from ZooKeeper as {@code databus.coord.zk.ClusterView.urls} reads them: the members
 * under {@code /databus/clusters/NAME/members} that advertise a URL, co-leaders first (they
 * capture, so they hold the newest windows when the leader is gone), the leader's URL
 * ({@code .../leader}) before all. ZooKeeper's client is the one in Spark's own jars.
 *
 * <p>A resolution opens a ZooKeeper session, reads, and closes it (no session held by a
 * task); the answer is kept for {@link #FRESH_MS} per address so the tasks of one batch
 * share it, and read again after a member failed ({@code fresh}). ZooKeeper unreachable or a
 * cluster without a live member is a transient {@code RelayUnavailable}.
 */
final class ZkCluster {
    static final String ROOT = "/databus/clusters";
    static final long FRESH_MS = 5_000;
    private static final Pattern ADDRESS =
        Pattern.compile("^zk://(?<hosts>[^/\\s]+)/(?<name>[A-Za-z0-9][A-Za-z0-9_.-]*)/?$");
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Map<String, Object[]> SEEN = new HashMap<>();  // address -> {millis, urls}

    final String hosts;
    final String name;

    private ZkCluster(String hosts, String name) {
        this.hosts = hosts;
        this.name = name;
    }

    /** The address in {@code spec}; ConfigError (naming {@code option}) when it is not one. */
    static ZkCluster parse(String spec, String who, String option) {
        Matcher m = ADDRESS.matcher(spec.strip());
        if (!m.matches()) {
            throw DatabusSourceException.config(who + ": invalid options: " + option + ": not a cluster address: '"
                + spec + "' (expected zk://HOST:PORT[,HOST:PORT...]/NAME)");
        }
        return new ZkCluster(m.group("hosts"), m.group("name"));
    }

    @Override
    public String toString() {
        return "zk://" + hosts + "/" + name;
    }

    /** The live members' URLs in reading order (see the class comment); never empty. */
    List<String> urls(double timeoutSeconds, boolean fresh) {
        String key = toString();
        synchronized (SEEN) {
            Object[] seen = SEEN.get(key);
            if (!fresh && seen != null && System.currentTimeMillis() - (long) seen[0] < FRESH_MS) {
                @SuppressWarnings("unchecked")
                List<String> urls = (List<String>) seen[1];
                return urls;
            }
        }
        List<String> urls = read(timeoutSeconds);
        if (urls.isEmpty()) {
            throw new DatabusSourceException("RelayUnavailable", "cluster " + this + " has no live member",
                true, null);
        }
        synchronized (SEEN) {
            SEEN.put(key, new Object[] {System.currentTimeMillis(), urls});
        }
        return urls;
    }

    private List<String> read(double timeoutSeconds) {
        long timeoutMs = Math.max(1000, (long) (timeoutSeconds * 1000));
        CountDownLatch connected = new CountDownLatch(1);
        Watcher watcher = (WatchedEvent e) -> {
            if (e.getState() == Watcher.Event.KeeperState.SyncConnected) {
                connected.countDown();
            }
        };
        ZooKeeper zk = null;
        try {
            zk = new ZooKeeper(hosts, (int) Math.max(4000, timeoutMs), watcher);
            if (!connected.await(timeoutMs, TimeUnit.MILLISECONDS)) {
                throw unavailable("ZooKeeper " + hosts + " did not answer in " + timeoutMs + " ms", null);
            }
            String base = ROOT + "/" + name;
            JsonNode leader = node(zk, base + "/leader");
            List<String> names;
            try {
                names = new ArrayList<>(zk.getChildren(base + "/members", false));
            } catch (KeeperException.NoNodeException e) {
                names = new ArrayList<>();
            }
            Collections.sort(names);
            List<String> coleaders = new ArrayList<>();
            List<String> others = new ArrayList<>();
            for (String n : names) {
                JsonNode m = node(zk, base + "/members/" + n);
                if (m == null || !m.path("url").isTextual() || m.path("url").asText().isEmpty()) {
                    continue;
                }
                (m.path("role").asText().equals("coleader") ? coleaders : others).add(m.path("url").asText());
            }
            List<String> urls = new ArrayList<>(coleaders);
            urls.addAll(others);
            String lead = leader == null ? null : leader.path("url").asText(null);
            if (lead != null && urls.remove(lead)) {
                urls.add(0, lead);
            }
            return List.copyOf(urls);
        } catch (IOException | KeeperException e) {
            throw unavailable("ZooKeeper: listing members failed: " + e.getClass().getSimpleName() + " "
                + e.getMessage(), e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw unavailable("interrupted while reading ZooKeeper " + hosts, e);
        } finally {
            if (zk != null) {
                try {
                    zk.close();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        }
    }

    private static JsonNode node(ZooKeeper zk, String path) throws KeeperException, InterruptedException {
        byte[] data;
        try {
            data = zk.getData(path, false, null);
        } catch (KeeperException.NoNodeException e) {
            return null;
        }
        try {
            JsonNode v = data == null ? null : JSON.readTree(data);
            return v != null && v.isObject() ? v : null;
        } catch (IOException e) {
            return null;
        }
    }

    private DatabusSourceException unavailable(String message, Throwable cause) {
        return new DatabusSourceException("RelayUnavailable", "cluster " + this + ": " + message, true, cause);
    }
}
