package io.fencekv;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * fencekv's fence for data kept in PostgreSQL (sqlfence/postgres.sql: table
 * {@code fencekv_fences}), checked through JDBC in the transaction that
 * writes the data, with the statement of the Go package sqlfence:
 *
 * <pre>{@code
 * conn.setAutoCommit(false);
 * SqlFence.check(conn, "inventory", lease.token()); // throws StaleTokenException
 * ... the writes ...
 * conn.commit();
 * }</pre>
 */
public final class SqlFence {
    /** The longest resource name, in bytes (the table's CHECK says the same). */
    public static final int MAX_RESOURCE = 1024;

    static final String RAISE = "INSERT INTO fencekv_fences AS f (resource, token) VALUES (?, ?)\n"
            + "ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token\n"
            + "RETURNING f.token";
    static final String READ = "SELECT token FROM fencekv_fences WHERE resource = ?";

    private SqlFence() {}

    /** The schema (sqlfence/postgres.sql): the table and the fencekv_fence function. Applying it again changes nothing. */
    public static String schema() {
        try (InputStream in = SqlFence.class.getResourceAsStream("postgres.sql")) {
            if (in == null) throw new IllegalStateException("postgres.sql is not on the class path");
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    /** Applies the schema on conn. */
    public static void install(Connection conn) throws SQLException {
        try (Statement st = conn.createStatement()) {
            st.execute(schema());
        }
    }

    /**
     * Checks token against resource's fence and raises the fence to it, in
     * conn's transaction, in one statement. Returns if token is not below the
     * fence (an equal token is the same holder again): commit as usual. A
     * token below it throws {@link StaleTokenException} with the fence: roll
     * the transaction back, its writes must not land.
     *
     * <p>The statement takes the resource's row lock until the transaction
     * ends, also when it refuses: a newer holder's check waits, so the order
     * of the tokens is the order of the commits, under every isolation level.
     * Call it before the writes it protects.
     *
     * @throws IllegalStateException if conn is in autocommit mode (the check
     *     would commit alone, protecting nothing)
     * @throws BadRequestException for an empty resource, one over 1024 bytes, or a token below 1
     */
    public static void check(Connection conn, String resource, long token) throws SQLException {
        if (conn == null) throw new IllegalArgumentException("sqlfence: no connection");
        if (conn.getAutoCommit()) {
            throw new IllegalStateException("sqlfence: the connection is in autocommit mode: call setAutoCommit(false), "
                    + "check, write and commit in one transaction");
        }
        int n = resource == null ? 0 : resource.getBytes(StandardCharsets.UTF_8).length;
        if (n == 0 || n > MAX_RESOURCE) {
            throw new BadRequestException("sqlfence: resource name of " + n + " bytes: want 1 to " + MAX_RESOURCE,
                    Map.of("code", "bad_request"));
        }
        if (token <= 0) {
            throw new BadRequestException("sqlfence: fencing token " + token + ": want 1 to 9223372036854775807",
                    Map.of("code", "bad_request"));
        }
        try (PreparedStatement st = conn.prepareStatement(RAISE)) {
            st.setString(1, resource);
            st.setLong(2, token);
            try (ResultSet rs = st.executeQuery()) {
                if (rs.next()) return;
            }
        }
        long current;
        try (PreparedStatement st = conn.prepareStatement(READ)) {
            st.setString(1, resource);
            try (ResultSet rs = st.executeQuery()) {
                if (!rs.next()) throw new SQLException("sqlfence: the fence of " + resource + " vanished after a refusal");
                current = rs.getLong(1);
            }
        }
        Map<String, Object> facts = new LinkedHashMap<>();
        facts.put("code", "stale_token");
        facts.put("fence", current);
        throw new StaleTokenException(resource + " is fenced at " + current + "; token " + token + " refused", facts);
    }
}
