// Package docs holds fencekv's documentation pages (the *.md files in this
// directory) and the tests that keep them honest: every relative link in
// README.md, docs/, clients/ and wire/PROTOCOL.md resolves to a file and
// heading; every fencekv command shown in a shell block names real
// subcommands and flags; the README's tour prints what it shows against a
// real server; the cluster and TLS walk-throughs run top to bottom on free
// ports; and every metric contrib/grafana-dashboard.json reads exists in a
// server's /metrics.
package docs
