// Package rendezvous is a small key-value store over TCP through which the
// ranks of a job meet before they have a communicator: rank 0 publishes
// NCCL's unique id, the others wait for it.
//
// It follows torchrun's convention: rank 0 serves the store at
// MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) connects to it as
// a client, and RANK and WORLD_SIZE say who is who (see FromEnv). A Store
// offers Set, Get (which waits until the key exists), Wait (for several
// keys) and Add (an atomic counter, for barriers and unique names), each
// bounded by its context's deadline or, when the context has none, by the
// Store's Timeout: nothing waits forever.
//
// The store holds a handful of small values for the life of a job; it is
// not a database. Keys and values are at most 1 MiB each. A Server keeps
// every key until it is closed.
//
// Protocol: one request at a time per connection, each a frame
//
//	op (1 byte) | key length (4 bytes, big endian) | key | value length (4) | value | wait (8, nanoseconds)
//
// answered by
//
//	status (1 byte) | value length (4) | value
//
// where a status other than 0 carries an error message as its value. Get
// and Wait are held by the server until the keys exist or the wait the
// client sent has passed; the client also bounds the connection with the
// same deadline, so a server that has died cannot hold it.
package rendezvous
