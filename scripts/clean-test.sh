#!/usr/bin/env bash
# Removes debris that an interrupted test run left behind: aenv servers and
# gVisor sandboxes started from temporary data dirs, their mounts, network
# namespaces, veths, firewall tables and cgroups, and the store tests'
# PostgreSQL clusters (/tmp/aenv-pg-*). Test servers use data dirs under
# /tmp and the network names listed below; the production defaults
# (/var/lib/aenv, prefix "aenv") are left alone.
set -uo pipefail

tmp_pattern='/tmp/[^ ]*'

# Servers and sandboxes of temporary data dirs.
pkill -KILL -f "aenv server .*--data-dir $tmp_pattern" 2>/dev/null
# Cluster tests: nodes (their data dir comes after the cluster flags) and
# gateways over a throwaway database's socket under /tmp.
pkill -KILL -f "aenv node .*--data-dir $tmp_pattern" 2>/dev/null
pkill -KILL -f "aenv gateway --database-url host=$tmp_pattern" 2>/dev/null
pkill -KILL -f "runsc.*--root[= ]$tmp_pattern" 2>/dev/null
# Throwaway PostgreSQL servers of the store tests (SIGQUIT: immediate
# shutdown, which also stops their workers).
pkill -QUIT -f "postgres -D /tmp/aenv-(e2e-)?pg[-.][^ ]*/data" 2>/dev/null
sleep 0.5
rm -rf /tmp/aenv-pg-* /tmp/aenv-e2e-pg.*

# Mounts under /tmp (runsc's null-netns pins, leftovers of crashed tests).
grep -o " /tmp/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do
	umount -l "$m" 2>/dev/null
done

# Network namespaces, veths and nftables tables of tests. The names come
# from the code that makes them; keep the two in step. A server's network
# pool names its namespaces <prefix>-<i>, its host veths <prefix><i>h and
# its table inet <prefix>; tests give it these prefixes:
#   it + 3 letters                   test/integration/harness_test.go (newServer)
#   e2 + 3 of [a-z0-9] + a letter    e2e/harness.mjs (AenvServer)
#   py + 4 letters                   sdk/python/run-tests.sh
#   bt + 2 letters                   internal/bench/bench_test.go (startServer)
#   t + 3 of [a-z0-9] + a letter     internal/network/root_test.go (testPrefix)
# Tests also make namespaces and veths of their own (the veth's other end,
# inside the namespace, goes with it):
#   netns fi<4 letters>, veth fi<4 letters>h
#       test/integration/network_test.go (newFakeInternet)
#   netns x<t prefix>-inet, veth x<t prefix>u
#       internal/network/fakenet_test.go (newFakeInternet)
#   netns aenvt-<8 hex>, veth avh<8 hex>
#       internal/runtime/runtimetest/netns.go (NewNetns)
#   netns aenvt-<6 hex>, veth aeh<6 hex>
#       cmd/envd/gvisor_test.go (newSandboxNet)
# None matches a pool of prefix "aenv" (aenv-<i>, aenv<i>h, inet aenv).
pool='(it[a-z]{3}|e2[a-z0-9]{3}[a-z]|py[a-z]{4}|bt[a-z]{2}|t[a-z0-9]{3}[a-z])'
netns_re="^(${pool}-[0-9]+|fi[a-z]{4}|xt[a-z0-9]{3}[a-z]-inet|aenvt-[0-9a-f]{6}|aenvt-[0-9a-f]{8})\$"
link_re="^(${pool}[0-9]+h|fi[a-z]{4}h|xt[a-z0-9]{3}[a-z]u|avh[0-9a-f]{8}|aeh[0-9a-f]{6})\$"
table_re="^${pool}\$"
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$netns_re"); do
	ip netns delete "$ns" 2>/dev/null
done
for link in $(ls /sys/class/net | grep -E "$link_re"); do
	ip link delete "$link" 2>/dev/null
done
for table in $(nft list tables 2>/dev/null | awk '$2 == "inet" {print $3}' | grep -E "$table_re"); do
	nft delete table inet "$table" 2>/dev/null
done

# Empty cgroup parents of gVisor drivers (named aenv-<hash>).
for dir in /sys/fs/cgroup/*/aenv-*/ /sys/fs/cgroup/aenv-*/; do
	[ -d "$dir" ] || continue
	for child in "$dir"*/; do [ -d "$child" ] && rmdir "$child" 2>/dev/null; done
	rmdir "$dir" 2>/dev/null
done
echo "clean-test: done"
