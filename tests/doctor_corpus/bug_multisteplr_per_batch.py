"""MultiStepLR(milestones=[3, 5]), epoch counts, stepped inside the batch loop: it decays twice
in the first epoch."""
# expect: scheduler_wrong_rate

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[3, 5], gamma=0.1)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
