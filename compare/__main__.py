from compare.cli import main

raise SystemExit(main())
