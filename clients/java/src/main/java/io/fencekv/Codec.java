package io.fencekv;

import java.io.IOException;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessageFormat;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessagePacker;
import org.msgpack.core.MessageUnpacker;

/** MessagePack encoding of requests and decoding of answers (PROTOCOL.md §2, §3). */
final class Codec {
    private Codec() {}

    /** Encodes {@code [0, msgid, method, [params]]}, or a notification {@code [2, method, [params]]} when msgid < 0. */
    static byte[] request(long msgid, String method, Map<String, Object> params) {
        try (MessageBufferPacker p = MessagePack.newDefaultBufferPacker()) {
            request(p, msgid, method, params);
            return p.toByteArray();
        } catch (IOException e) {
            throw new IllegalStateException(e); // a buffer packer does not fail
        }
    }

    /** Packs the request into p. */
    static void request(MessagePacker p, long msgid, String method, Map<String, Object> params) throws IOException {
        if (msgid < 0) {
            p.packArrayHeader(3).packInt(2);
        } else {
            p.packArrayHeader(4).packInt(0).packLong(msgid);
        }
        p.packString(method);
        if (params == null || params.isEmpty()) {
            p.packArrayHeader(0);
        } else {
            p.packArrayHeader(1);
            pack(p, params);
        }
    }

    @SuppressWarnings("unchecked")
    static void pack(MessagePacker p, Object v) throws IOException {
        if (v == null) {
            p.packNil();
        } else if (v instanceof byte[]) {
            byte[] b = (byte[]) v;
            p.packBinaryHeader(b.length).writePayload(b);
        } else if (v instanceof String) {
            p.packString((String) v);
        } else if (v instanceof Boolean) {
            p.packBoolean((Boolean) v);
        } else if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            p.packLong(((Number) v).longValue());
        } else if (v instanceof BigInteger) {
            p.packBigInteger((BigInteger) v);
        } else if (v instanceof Map) {
            Map<Object, Object> m = (Map<Object, Object>) v;
            int n = 0;
            for (Object val : m.values()) if (val != null) n++;
            p.packMapHeader(n);
            for (Map.Entry<Object, Object> e : m.entrySet()) {
                if (e.getValue() == null) continue; // nil means absent anyway
                pack(p, e.getKey());
                pack(p, e.getValue());
            }
        } else if (v instanceof List) {
            List<Object> l = (List<Object>) v;
            p.packArrayHeader(l.size());
            for (Object o : l) pack(p, o);
        } else if (v instanceof Double || v instanceof Float) {
            p.packDouble(((Number) v).doubleValue());
        } else {
            throw new IllegalArgumentException("cannot encode " + v.getClass().getName());
        }
    }

    /**
     * Reads one value: maps become LinkedHashMap with String keys, arrays
     * ArrayList, str String (invalid UTF-8 replaced: holders and messages may
     * quote client bytes), bin byte[], integers Long (a uint64 above 2^63-1
     * BigInteger), nil null.
     */
    static Object unpack(MessageUnpacker u) throws IOException {
        MessageFormat f = u.getNextFormat();
        switch (f.getValueType()) {
            case NIL:
                u.unpackNil();
                return null;
            case BOOLEAN:
                return u.unpackBoolean();
            case INTEGER:
                if (f == MessageFormat.UINT64) {
                    BigInteger b = u.unpackBigInteger();
                    return b.bitLength() < 64 ? (Object) b.longValue() : b;
                }
                return u.unpackLong();
            case FLOAT:
                return u.unpackDouble();
            case STRING: {
                int n = u.unpackRawStringHeader();
                return new String(u.readPayload(n), StandardCharsets.UTF_8);
            }
            case BINARY: {
                int n = u.unpackBinaryHeader();
                return u.readPayload(n);
            }
            case ARRAY: {
                int n = u.unpackArrayHeader();
                List<Object> l = new ArrayList<>(Math.min(n, 1024));
                for (int i = 0; i < n; i++) l.add(unpack(u));
                return l;
            }
            case MAP: {
                int n = u.unpackMapHeader();
                Map<String, Object> m = new LinkedHashMap<>();
                for (int i = 0; i < n; i++) {
                    Object k = unpack(u);
                    Object val = unpack(u);
                    m.put(k instanceof byte[] ? new String((byte[]) k, StandardCharsets.UTF_8) : String.valueOf(k), val);
                }
                return m;
            }
            case EXTENSION: {
                u.skipValue();
                return null;
            }
            default:
                throw new IOException("unexpected MessagePack format " + f);
        }
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    // Field accessors for result maps.

    static long lng(Map<String, Object> m, String k) {
        Object v = m.get(k);
        if (v instanceof Number) return ((Number) v).longValue();
        return 0;
    }

    static boolean bool(Map<String, Object> m, String k) {
        return Boolean.TRUE.equals(m.get(k));
    }

    static String str(Map<String, Object> m, String k) {
        Object v = m.get(k);
        if (v instanceof byte[]) return new String((byte[]) v, StandardCharsets.UTF_8);
        return v == null ? "" : v.toString();
    }

    static byte[] bin(Map<String, Object> m, String k) {
        Object v = m.get(k);
        if (v instanceof byte[]) return (byte[]) v;
        if (v instanceof String) return bytes((String) v);
        return null;
    }

    @SuppressWarnings("unchecked")
    static List<Map<String, Object>> list(Map<String, Object> m, String k) {
        Object v = m.get(k);
        if (v instanceof List) return (List<Map<String, Object>>) v;
        return List.of();
    }
}
