#!/bin/sh
# A nightly report that runs on several machines' crontabs, but only on one
# machine at a time, and whose result no late run can overwrite.
#
#   # crontab -e, on every machine:
#   15 2 * * * FENCEKV_ADDR=10.0.0.1:7420,10.0.0.2:7420,10.0.0.3:7420 /opt/fencekv/examples/cron-report.sh
#
# run-locked takes the lock "reports/nightly" (waiting up to 10 minutes
# for a run elsewhere to finish), renews it while the report runs, and
# stops the report if the lease may be lost. The report's write is fenced
# with the lock's token: if this run stalled past its lease and another
# machine's run wrote since, the store refuses this one (exit 3).
#
# Exit statuses: the report's own; 4 if the lock stayed held all along;
# 75 if the lease may have been lost and the report was stopped.
set -eu

: "${FENCEKV_ADDR:=127.0.0.1:7420}"
export FENCEKV_ADDR

exec fencekv run-locked reports/nightly --ttl 1m --wait 10m --lost-status 75 -- sh -c '
	set -eu
	report=$(date -u +%Y-%m-%dT%H:%M:%SZ; uptime)
	# A fenced write: refused if a newer holder of the lock has written.
	printf "%s\n" "$report" | fencekv put reports/nightly/latest - --token "$FENCEKV_TOKEN"
	# A held write as well: refused once this lease has run out.
	fencekv put reports/nightly/finished-by "$(hostname)" --token "$FENCEKV_TOKEN" --lock "$FENCEKV_LOCK"
'
