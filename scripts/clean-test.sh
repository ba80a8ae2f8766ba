#!/usr/bin/env bash
# Removes debris that an interrupted test run left behind: aenv servers and
# gVisor sandboxes started from temporary data dirs, their mounts, network
# namespaces, veths, firewall tables and cgroups, and the store tests'
# PostgreSQL clusters (/tmp/aenv-pg-*). Test servers use data dirs under
# /tmp and network prefixes starting with "it", "e2", "py" or "t"; the
# production defaults (/var/lib/aenv, prefix "aenv") are left alone.
set -uo pipefail

tmp_pattern='/tmp/[^ ]*'

# Servers and sandboxes of temporary data dirs.
pkill -KILL -f "aenv server --data-dir $tmp_pattern" 2>/dev/null
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

# Network namespaces, veths and nftables tables of test prefixes.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^(it|e2|py|t)[a-z0-9]*-[0-9]+$'); do
	ip netns delete "$ns" 2>/dev/null
done
for link in $(ls /sys/class/net | grep -E '^(it|e2|py|t)[a-z0-9]*[0-9]+h$'); do
	ip link delete "$link" 2>/dev/null
done
for table in $(nft list tables 2>/dev/null | awk '$2 == "inet" {print $3}' | grep -E '^(it|e2|py|t)[a-z0-9]*$'); do
	nft delete table inet "$table" 2>/dev/null
done

# Empty cgroup parents of gVisor drivers (named aenv-<hash>).
for dir in /sys/fs/cgroup/*/aenv-*/ /sys/fs/cgroup/aenv-*/; do
	[ -d "$dir" ] || continue
	for child in "$dir"*/; do [ -d "$child" ] && rmdir "$child" 2>/dev/null; done
	rmdir "$dir" 2>/dev/null
done
echo "clean-test: done"
