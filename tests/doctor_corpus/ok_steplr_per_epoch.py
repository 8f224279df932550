"""StepLR, whose `step_size` counts epochs, stepped once at the end of each epoch."""
# expect: none

import torch


def train_one_epoch(model, loader, optimizer, criterion, device):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x.to(device)), y.to(device)).backward()
        optimizer.step()


@torch.no_grad()
def validate(model, loader, criterion, device):
    model.eval()
    return sum(criterion(model(x.to(device)), y.to(device)).item() for x, y in loader)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for _ in range(epochs):
        train_one_epoch(model, train_loader, optimizer, loss_fn, device)
        validate(model, val_loader, loss_fn, device)
        scheduler.step()
