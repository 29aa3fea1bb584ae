package io.fencekv;

import java.util.List;

/** One page of {@code scan} or {@code locks}: the items, and whether more match after them. */
public record Page<T>(List<T> items, boolean more) {}
