package io.fencekv;

/** The answer to {@code backup}: the copy held for this connection, read it with {@code backupRead}. */
public record BackupInfo(long size, long index, long lastToken, long revision, long chunkSize) {}
