"""Takes far longer than any timeout the tests give it."""
import time

time.sleep(600)
