package io.fencekv;

/** One node of a cluster as {@code members} reports it. */
public record Member(String node, String clientAddr, String raftAddr, String gossipAddr, String state,
        boolean voter, String raftRole) {}
