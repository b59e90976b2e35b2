"""Running a user's script under a backend: the backend resolver, the child runner, the
instrumented session that records graphs and tags failures, and the warm fork servers."""
