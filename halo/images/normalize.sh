#!/bin/sh
# halo-normalize: the last command of every RUN step in Halo's Dockerfiles.
#
# Docker's built-in BuildKit (20.10) writes each file's mtime into the layer and has no
# rewrite-timestamp, so a layer's digest would change with the wall clock. Everything this
# step created or changed is newer than SOURCE_DATE_EPOCH (lower layers were normalised to
# it, and a made base is clamped to it), so giving exactly those files that time makes the
# layer a function of its inputs. Files of lower layers are left alone: touching one would
# copy it up into this layer. Mount points (proc, sys, dev, BuildKit's /etc/hosts and
# resolv.conf, the build's bind mounts) are other filesystems and never part of a layer.
set -eu
epoch="${SOURCE_DATE_EPOCH:?halo-normalize: SOURCE_DATE_EPOCH is not set}"
prune="-path /proc"
while read -r _ _ _ _ mountpoint _; do
    [ "$mountpoint" = / ] || prune="$prune -o -path $mountpoint"
done </proc/self/mountinfo
# shellcheck disable=SC2086 # $prune is a list of find arguments
find / -xdev \( $prune \) -prune -o -newermt "@$epoch" -exec touch -h -d "@$epoch" {} +
