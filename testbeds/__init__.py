"""Test servers the harness is tried against where users have the real thing: a local Slurm cluster of network-namespace
nodes (slurm_cluster.py) and a local Ceph RADOS Gateway for S3 (ceph_s3.py). Used by the tests, the benchmarks and
scripts/local-cluster.sh and scripts/local-s3.sh; not part of the installed harness and never imported by it."""
