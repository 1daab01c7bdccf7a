from rocm_yolo.cli import main

raise SystemExit(main())
