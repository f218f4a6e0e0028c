"""Allow ``python -m toolrollout`` as an alias of the ``toolrollout`` command."""

from toolrollout.apps import main

if __name__ == "__main__":
    main()
