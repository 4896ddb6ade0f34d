"""The wire types: msgspec structs of every body and answer, shared by the edges, the
service and the client SDK."""
