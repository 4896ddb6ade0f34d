"""The pure core: no asyncio, sockets, environment, clock reads or logging set-up."""
