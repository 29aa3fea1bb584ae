// Move N units between two rows of an inventory table in PostgreSQL under
// the fencekv lock "inventory", fenced: the transaction checks the lease's
// token against the fence (SqlFence) before it writes, so a holder that
// paused past its lease cannot commit over a newer one. Run it as a single
// source file, with the client and the PostgreSQL JDBC driver on the path:
//
//   FENCEKV_ADDR=127.0.0.1:7420 JDBC_URL=jdbc:postgresql://localhost/shop \
//       java -cp fencekv-client.jar:msgpack-core.jar:postgresql.jar Inventory.java apple pear 5

import io.fencekv.FencekvClient;
import io.fencekv.FencekvException;
import io.fencekv.Lease;
import io.fencekv.LockOptions;
import io.fencekv.SqlFence;
import io.fencekv.StaleTokenException;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;

public class Inventory {
    public static void main(String[] args) throws SQLException {
        if (args.length != 3 || Integer.parseInt(args[2]) < 1) {
            System.err.println("usage: Inventory FROM TO N (N a positive integer)");
            System.exit(2);
        }
        String from = args[0], to = args[1];
        int n = Integer.parseInt(args[2]);
        String addr = System.getenv().getOrDefault("FENCEKV_ADDR", "127.0.0.1:7420");
        String url = System.getenv().getOrDefault("JDBC_URL", "jdbc:postgresql://localhost/shop");
        try (FencekvClient client = FencekvClient.connect(addr.split(","));
             Connection conn = DriverManager.getConnection(url);
             // Acquire (queueing up to 30s), renewed in the background; close releases it.
             Lease lease = client.lock("inventory", Duration.ofSeconds(10), LockOptions.waitFor(Duration.ofSeconds(30)))) {
            conn.setAutoCommit(false); // one transaction: the check and the writes
            try {
                SqlFence.check(conn, "inventory", lease.token()); // StaleTokenException: a newer holder wrote
                int left = update(conn, "UPDATE inventory SET qty = qty - ? WHERE sku = ? AND qty >= ? RETURNING qty", n, from, n);
                if (left < 0) throw new IllegalStateException("take " + n + " from " + from + ": not that many (or no such sku)");
                int now = update(conn, "UPDATE inventory SET qty = qty + ? WHERE sku = ? RETURNING qty", n, to, null);
                if (now < 0) throw new IllegalStateException("put " + n + " into " + to + ": no such sku");
                lease.check(); // the last moment to stop: a lease that may be lost does not commit
                conn.commit();
                System.out.printf("moved %d from %s to %s under token %d: %s %d, %s %d%n", n, from, to, lease.token(), from, left, to, now);
            } catch (SQLException | RuntimeException e) {
                conn.rollback(); // nothing of this transaction lands
                throw e;
            }
        } catch (StaleTokenException e) {
            System.err.println("inventory: refused, nothing written: " + e.getMessage() + " (fence " + e.fence() + ")");
            System.exit(1);
        } catch (FencekvException | IllegalStateException e) {
            System.err.println("inventory: " + e.getMessage());
            System.exit(1);
        }
    }

    /** Runs an UPDATE ... RETURNING qty; -1 when it matched no row. */
    static int update(Connection conn, String sql, int n, String sku, Integer min) throws SQLException {
        try (PreparedStatement st = conn.prepareStatement(sql)) {
            st.setInt(1, n);
            st.setString(2, sku);
            if (min != null) st.setInt(3, min);
            try (ResultSet rs = st.executeQuery()) {
                return rs.next() ? rs.getInt(1) : -1;
            }
        }
    }
}
