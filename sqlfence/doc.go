// Package sqlfence fences data kept in a SQL database with fencekv's
// tokens: the database itself refuses a write whose lock holder's lease
// ran out, as fencekv refuses it for its own keys.
//
// A fence table (Table) keeps, per protected resource, the highest token
// a transaction presented. Check compares a token and raises the fence in
// one statement, in the caller's transaction, before the writes it
// protects:
//
//	err := client.WithLock(ctx, "inventory", 10*time.Second, nil, func(ctx context.Context, l fencekv.Lease) error {
//		tx, err := db.BeginTx(ctx, nil)
//		if err != nil {
//			return err
//		}
//		defer tx.Rollback()
//		if err := sqlfence.Postgres.Check(ctx, tx, "inventory", l.Token); err != nil {
//			return err // fencekv.ErrStaleToken: a newer holder has written
//		}
//		if _, err := tx.ExecContext(ctx, "UPDATE stock SET qty = qty - 1 WHERE sku = $1", sku); err != nil {
//			return err
//		}
//		return tx.Commit()
//	})
//
// Dialect.WithLock does the same in one call, and does not commit once the
// lease may be lost. The schemas are postgres.sql and sqlite.sql beside
// this file (Dialect.Schema, Dialect.Install); PostgreSQL also gets
// fencekv_fence(resource, token), the check as a function that raises
// SQLSTATE FK001, for programs in any language.
//
// # What the fence promises
//
// Transactions that pass the check commit in the order of their tokens:
// the check takes the resource's row lock, so a newer holder's check waits
// until an older transaction that passed it ends. A stale token is refused
// and its transaction must not commit. This holds under READ COMMITTED,
// REPEATABLE READ and SERIALIZABLE alike.
//
// It does not bound how late an older holder's transaction commits once it
// has passed the check: a holder that checked and then paused holds the
// row lock, the newer holder's check waits, and the older one's writes
// land first when it resumes. Bound it with the database's timeouts
// (lock_timeout for the waiting holder, idle_in_transaction_session_timeout
// and statement_timeout for the paused one) and with Dialect.WithLock,
// which does not commit once the lease may be lost.
//
// # A fence column instead of a table
//
// When each protected row is its own resource, keep the fence on the row:
// a column fence bigint NOT NULL DEFAULT 0, and every write
//
//	UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
//
// where no row changed means a stale token (or no such row). It costs no
// second table or lock, but each statement must carry the condition; the
// fence table protects any number of statements and tables with one check.
package sqlfence
