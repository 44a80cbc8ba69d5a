from exhume.cli import main

raise SystemExit(main())
