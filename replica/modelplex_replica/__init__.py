"""The replica runtime: the serving process in each GPU pod (the only component that imports torch)."""
