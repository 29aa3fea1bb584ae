package io.fencekv;

import java.util.LinkedHashMap;
import java.util.Map;

/** One write of a {@code txn}: put, delete or incr. */
public final class TxnOp {
    final Map<String, Object> m = new LinkedHashMap<>();

    private TxnOp(String op, byte[] key) {
        m.put("op", op);
        m.put("key", key);
    }

    public static TxnOp put(byte[] key, byte[] value) {
        TxnOp o = new TxnOp("put", key);
        o.m.put("value", value);
        return o;
    }

    public static TxnOp put(String key, String value) {
        return put(Codec.bytes(key), Codec.bytes(value));
    }

    public static TxnOp delete(byte[] key) {
        return new TxnOp("delete", key);
    }

    public static TxnOp delete(String key) {
        return delete(Codec.bytes(key));
    }

    public static TxnOp incr(byte[] key, long delta) {
        TxnOp o = new TxnOp("incr", key);
        o.m.put("delta", delta);
        return o;
    }

    public static TxnOp incr(String key, long delta) {
        return incr(Codec.bytes(key), delta);
    }

    /** A compare of a {@code txn}: key is at revision (0: absent). */
    public static Map<String, Object> compare(String key, long revision) {
        Map<String, Object> c = new LinkedHashMap<>();
        c.put("key", Codec.bytes(key));
        c.put("revision", revision);
        return c;
    }
}
