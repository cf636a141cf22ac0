"""Measuring the engine (chapter 21): GPU time of one op (perf) and the bytes and FLOPs a forward
step must at least cost (roofline). The engine never imports this package; the scripts under
benchmark/ and the chapter's main do."""
