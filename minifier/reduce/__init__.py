"""Shrinking a failing graph: the engine, its passes (one file each), graph surgery, the
failure oracle, the warm query workers and the minify session that ties them together."""
