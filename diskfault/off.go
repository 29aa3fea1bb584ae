//go:build !failpoints

package diskfault

// Enabled reports whether this is a build with failpoints (-tags
// failpoints). It is a constant, so that `if diskfault.Enabled` blocks
// compile away in the default build.
const Enabled = false

// Hit is a failpoint; in the default build it does nothing.
func Hit(point string) error { return nil }
