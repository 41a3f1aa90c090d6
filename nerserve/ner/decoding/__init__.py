"""Decoding shared by every architecture (numpy and stdlib only): the overlap rules, best-first
acceptance and de-duplication of candidate entities, and the step loop of decoders with a cache."""
