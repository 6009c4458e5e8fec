SHELL := /bin/bash

# pgfence developer targets.
#
# The fault suite (test/chaos, build tag "chaos") and the Patroni suite
# (test/patroni, build tag "patroni") live in the test module, test/go.mod;
# their targets run there (go -C test). The fault suite needs root, the
# PostgreSQL server binaries, and: nftables iproute2 faketime libfaketime
# pgbouncer. Each scenario prints a line
#   chaos: scenario=NAME ops=N verdict=linearizable|violation detected
# (negative controls must say "violation detected").

GO ?= go
# Long soak: each workload scenario runs this long (a Go duration).
CHAOS_DURATION ?= 10m
# porcupine's budget per history on long runs.
CHAOS_CHECK_TIMEOUT ?= 10m

CHAOS_SUMMARY := '^(---|ok|FAIL|panic)|chaos: scenario=|detected as expected|danger shown|reissued|server clock|preserved|through PgBouncer|client timestamp|granted across|child observed|power cuts?:|power-loss:|combined statements|model-replay:'
# On failure the whole log is printed, then this digest of the failures
# (every failed test, subtests included, and each failed assertion), last,
# so that a truncated CI log still ends with why.
CHAOS_FAILURES := 'Error Trace:|^panic:|^[[:space:]]*--- FAIL|test timed out'
CHAOS_DIGEST = { echo; echo '=== failures'; grep -E -A14 $(CHAOS_FAILURES) $$log | tail -n 300; }

# Each fuzz target runs this long under make fuzz (their seed corpora run
# in every plain go test). A target under ./test/ runs in the test module.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./leasetable:FuzzLeaseName ./advisory:FuzzNameKey ./fence:FuzzScanParams \
	./fence:FuzzParseTable ./fence:FuzzBuilderFragments ./fence:FuzzBuilderIdentifiers \
	./test/chaos:FuzzCheckSequentialRegister

.PHONY: chaos chaos-ci fuzz model-ci patroni-ci powerloss-ci tools-ci

# model-ci checks the Promela model of the protocol (model/pgfence.pml) with
# spin: 14 runs must verify and 16 controls must find their counterexample
# (the asynchronous failover is the negative control); about a minute. It
# needs spin and gcc. See model/README.md.
model-ci:
	bash model/run

# tools-ci runs the tests outside the fault suite that need a tool beyond
# the PostgreSQL server binaries (build tag "tools": PgBouncer).
tools-ci:
	$(GO) test -race -count=1 -tags tools -run 'BehindTransactionPooler' ./leasetable/

# chaos-ci is the short schedule CI runs: every fault, a few minutes in all.
# The summary lines are printed; on failure the whole log follows (with the
# history and the path of porcupine's visualisation), then the digest.
chaos-ci:
	@log=$${TMPDIR:-/tmp}/pgfence-chaos-ci.log; \
	$(GO) -C test test -race -shuffle=on -count=1 -tags chaos -timeout 15m -skip '^TestPowerLoss' -v ./chaos/... >$$log 2>&1; \
	status=$$?; grep -E $(CHAOS_SUMMARY) $$log; \
	if [ $$status -ne 0 ]; then cat $$log; $(CHAOS_DIGEST); fi; exit $$status

# powerloss-ci runs the power-loss scenarios of the fault suite (test/chaos,
# TestPowerLoss*, which chaos-ci and chaos leave out): the cluster's data
# directory on a FUSE filesystem that drops every write not yet fsynced when
# the power is cut (chaos.PowerLossFS). One after another, 2.5-3.5
# minutes on 2 cores, build included. It needs root and /dev/fuse (the
# filesystem is mounted by mount(2), not fusermount).
powerloss-ci:
	@log=$${TMPDIR:-/tmp}/pgfence-powerloss-ci.log; \
	$(GO) -C test test -race -count=1 -tags chaos -timeout 10m -run '^TestPowerLoss' -v ./chaos/... >$$log 2>&1; \
	status=$$?; grep -E $(CHAOS_SUMMARY) $$log; \
	if [ $$status -ne 0 ]; then cat $$log; $(CHAOS_DIGEST); fi; exit $$status

# chaos is the long local soak: make chaos CHAOS_DURATION=1h
chaos:
	@log=$${TMPDIR:-/tmp}/pgfence-chaos-soak.log; \
	CHAOS_DURATION=$(CHAOS_DURATION) CHAOS_CHECK_TIMEOUT=$(CHAOS_CHECK_TIMEOUT) \
		$(GO) -C test test -race -count=1 -tags chaos -timeout 0 -skip '^TestPowerLoss' -v ./chaos/... >$$log 2>&1; \
	status=$$?; grep -E $(CHAOS_SUMMARY) $$log; \
	if [ $$status -ne 0 ]; then cat $$log; $(CHAOS_DIGEST); fi; exit $$status

# patroni-ci runs the Patroni suite (test/patroni, build tag "patroni"):
# etcd and three Patroni nodes on loopback, a synchronous run through every
# fault and the asynchronous negative control, 3-4 minutes on 2 cores. It needs
# patroni, etcd-server, etcd-client, python3-etcd and python3-psycopg2
# (.ci/patroni-setup installs them). Each fault prints its figures
#   patroni: fault=NAME mode=sync|async ... to_new_primary=... no_grants=...
# and each run its violation counts (patroni: run=...). On failure the
# whole log follows (with the nodes' Patroni logs), then the digest.
PATRONI_SUMMARY := '^(---|ok|FAIL|panic)|patroni: (fault|run)=|model forbids'
patroni-ci:
	@log=$${TMPDIR:-/tmp}/pgfence-patroni-ci.log; \
	$(GO) -C test test -race -count=1 -tags patroni -timeout 12m -v ./patroni/... >$$log 2>&1; \
	status=$$?; grep -E $(PATRONI_SUMMARY) $$log; \
	if [ $$status -ne 0 ]; then cat $$log; $(CHAOS_DIGEST); fi; exit $$status

# fuzz runs every fuzz target for FUZZTIME: make fuzz FUZZTIME=5m
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; mod=.; \
		case $$pkg in ./test/*) mod=test; pkg=./$${pkg#./test/};; esac; \
		echo "fuzz: $$mod $$pkg $$name"; \
		$(GO) -C $$mod test -run '^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $$pkg; \
	done
