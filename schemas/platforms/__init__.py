"""A specctl deployment on cluster platforms: Kubernetes (RoleBasedGroup, LeaderWorkerSet, Dynamo's
DynamoGraphDeployment) and Slurm, and those manifests read back as SGLang commands. Torch-free."""
