"""What the tests share: throwaway projects, engine and process helpers, servers and hosts they start."""
