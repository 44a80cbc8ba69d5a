from exhume.cli import main

if __name__ == "__main__":  # guarded: a portfolio's worker processes (spawn) import this module again
    raise SystemExit(main())
