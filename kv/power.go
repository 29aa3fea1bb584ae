package kv

import (
	"io"

	bolt "go.etcd.io/bbolt"
)

// image writes a consistent copy of the data file as last committed: for
// the power-loss recorder (package diskfault, in a build with -tags
// failpoints), which keeps it as what a power cut would leave of the file.
func (s *Store) image(w io.Writer) error {
	return s.db.View(func(tx *bolt.Tx) error {
		_, err := tx.WriteTo(w)
		return err
	})
}
