"""The database surface: typed wrappers of the runrow.* SQL functions, the LISTEN hub and the
journal tail, keys, migrate, install.sql generation and the throwaway cluster; and the bounded
waits (aio) every async part of the package uses, and the threads of their own (threads) that
blocking calls run in, out of asyncio's default pool; and journaled text made safe for a
terminal (terminal_text), which the CLI and the demo both write.

The floor of the package: it imports nothing else of pyworker, and everything may import it.
"""
