package io.databus.spark;

/**
 * Every failure of the databus source, typed like the Python side's error tree.
 *
 * <p>{@link #code()} is the {@code code} of the {@code databus.core.errors} class the
 * Python source raises for the same cause ({@code ConfigError}, {@code UnknownSource},
 * {@code RelayUnavailable}, {@code RelayProtocolError}, {@code SchemaError},
 * {@code CorruptEvent}, or a relay's error code: the {@code code} of the Python class): {@code databus.spark.jvm} rebuilds
 * that class from it at the Python boundary. The message is the one the Python source
 * gives. An {@link IllegalArgumentException}, so PySpark surfaces a failure at
 * {@code load()} as its own {@code IllegalArgumentException} carrying this message.
 */
public class DatabusSourceException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;
    private final String code;
    private final boolean transientError;

    public DatabusSourceException(String code, String message) {
        this(code, message, false, null);
    }

    public DatabusSourceException(String code, String message, boolean transientError, Throwable cause) {
        super(message, cause);
        this.code = code;
        this.transientError = transientError;
    }

    /** The Python error class name (see the class comment). */
    public String code() {
        return code;
    }

    /** Whether retrying may succeed (the relay is unreachable or restarting). */
    public boolean isTransient() {
        return transientError;
    }

    static DatabusSourceException config(String message) {
        return new DatabusSourceException("ConfigError", message);
    }

    static DatabusSourceException schema(String message) {
        return new DatabusSourceException("SchemaError", message);
    }

    static DatabusSourceException corrupt(String message) {
        return new DatabusSourceException("CorruptEvent", message);
    }
}
