"""``POST /summarize`` without HTTP: the cost budget checked before queueing (`limits`) and the service that
validates, queues, waits and answers (`service`)."""
