"""`procstore.Client` and what it returns: operating a store from any process, without a manager."""
