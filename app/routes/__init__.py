"""HTTP routes: thin functions that parse, call the service and map the result."""
