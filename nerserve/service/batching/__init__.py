"""Dynamic batching (imports nothing from the project): per-model queue of sentences, token
budget on padded cost, length-aware packing inside the wait window, bounded queue, deadlines,
cancellation, and a prepare stage that overlaps the running batch."""
