"""Replication of the commit log in a broker group (docs/replication.md): the leader's feed of
its log to followers, a follower's link to the leader, the in-sync set and the commit offset."""
