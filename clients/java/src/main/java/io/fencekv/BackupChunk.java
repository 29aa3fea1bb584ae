package io.fencekv;

/** One chunk of a backup: its bytes, whether it is the last, and then the CRC-32C of the whole copy. */
public record BackupChunk(byte[] data, boolean done, long crc32c) {}
