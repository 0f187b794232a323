from sluice.runtime.cli import entry

if __name__ == "__main__":  # spawned children re-import this module as __mp_main__
    entry()
